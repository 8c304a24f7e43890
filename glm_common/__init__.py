"""What the training library (``glm_dist``) and the data pipeline (``data_pipeline``) both need:
the user-facing error type and the YAML config rules. It imports neither of them."""
