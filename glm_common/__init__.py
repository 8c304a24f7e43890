"""What the training library (``glm_dist``) and the data pipeline (``data_pipeline``) both need:
the user-facing error type, the YAML config rules, durable files and the one storage layer (paths
or fsspec URLs) that pipeline runs and checkpoints are written through. It imports neither of them."""
