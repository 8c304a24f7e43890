"""What a GPU run needs, enforced on the CPU: collectives only through ``parallel/comm.py`` with
tensors on the backend's device, one all-reduce and no host sync per micro batch, the srun
environment, RNG state of the local device only, the optimizer step count where fused Adam reads it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from glm_dist.parallel import comm
from glm_dist.parallel.distributed import first_host, srun_environment
from tests.conftest import FAST, ROOT, TINY, clean_env

COLLECTIVES = re.compile(
    r"\b(?:dist|torch\.distributed)\.(all_reduce|all_gather\w*|broadcast\w*|barrier|reduce\w*|"
    r"send|recv|isend|irecv|gather\w*|scatter\w*|all_to_all\w*|monitored_barrier)\("
)


def test_no_module_outside_the_communication_helpers_calls_a_collective():
    offenders = []
    for path in sorted((ROOT / "glm_dist").rglob("*.py")):
        if path.name == "comm.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if COLLECTIVES.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "collectives outside glm_dist/parallel/comm.py:\n" + "\n".join(offenders)


def test_helpers_put_tensors_on_the_device_of_the_backend(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert comm.device_for_backend("nccl") == torch.device("cuda", 3)
    assert comm.device_for_backend("nccl", prefer=torch.device("cpu")) == torch.device("cuda", 3)
    assert comm.device_for_backend("nccl", prefer=torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert comm.device_for_backend("gloo", prefer=torch.device("cuda", 1)) == torch.device("cpu")
    mixed = "cpu:gloo,cuda:nccl"
    assert comm.device_for_backend(mixed, prefer=torch.device("cpu")) == torch.device("cpu")
    assert comm.device_for_backend(mixed, prefer=torch.device("cuda", 2)) == torch.device("cuda", 2)
    assert comm.backend_devices(mixed) == ("cpu", "cuda")


BROADCAST = """
import json, sys, torch, torch.distributed as dist
from glm_dist.parallel import comm
from glm_dist.parallel.distributed import shutdown_distributed
dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
batches = [{"input_ids": torch.arange(7), "mask": torch.tensor([True, False, True]), "w": torch.ones(2, 3) / 3,
            "rows": torch.tensor(5), "none": torch.zeros(0, 4, dtype=torch.int16)},
           {"labels": torch.tensor([[-100, 4], [2, 9]], dtype=torch.int32)}]
got = comm.broadcast_batches(batches if dist.get_rank() == 0 else None)
same = len(got) == 2 and all(a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
                                                         for k in a) for a, b in zip(got, batches))
print(json.dumps({"rank": dist.get_rank(), "same": same}))
shutdown_distributed()  # as every command does: gloo's threads left to teardown can abort the process
"""


def test_batches_broadcast_over_a_group_arrive_whole_with_their_dtypes_and_shapes(tmp_path):
    """Mixed dtypes and sizes in one buffer (a bool mask before int64 ids, a 0-dim and an empty tensor)."""
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BROADCAST, init, str(r)],
            cwd=ROOT,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    assert [json.loads(out) for out, _ in outs] == [{"rank": 0, "same": True}, {"rank": 1, "same": True}]


def test_srun_environment_has_a_rendezvous_and_a_device_per_task():
    assert first_host("gpu[07-09,12],cpu1") == "gpu07" and first_host("node1,node2") == "node1"
    assert first_host("dgx-a100-[001-004]") == "dgx-a100-001"
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "16",
        "SLURM_LOCALID": "5",
        "SLURM_JOB_ID": "123456",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
    }
    one_gpu_per_task = srun_environment(env, visible_devices=1)
    assert one_gpu_per_task == {
        "RANK": "5",
        "WORLD_SIZE": "16",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": str(20000 + 123456 % 20000),
    }
    assert srun_environment(env, visible_devices=8)["LOCAL_RANK"] == "5"
    with pytest.raises(RuntimeError, match="sees 4 GPUs"):
        srun_environment(env, visible_devices=4)


def test_rng_state_is_json_and_holds_no_other_device():
    from glm_dist.checkpoint.files import rng_state, set_rng_state

    state = json.loads(json.dumps(rng_state(torch.device("cpu"))))
    assert "cuda" not in state
    expected = (np.random.rand(), torch.rand(1).item())
    set_rng_state(state, torch.device("cpu"))
    assert (np.random.rand(), torch.rand(1).item()) == expected


def test_restored_step_count_sits_where_fused_adam_reads_it():
    from glm_dist.parallel.fragments import step_like as _step_like

    p = torch.nn.Parameter(torch.zeros(2, device="meta"))
    fused = type("Opt", (), {"param_groups": [{"params": [p], "fused": True}]})()
    plain = type("Opt", (), {"param_groups": [{"params": [p], "fused": None}]})()
    assert _step_like(fused, p, 7.0).device.type == "meta"
    assert _step_like(plain, p, 7.0).device.type == "cpu" and float(_step_like(plain, p, 7.0)) == 7.0


class HostSyncs(TorchDispatchMode):
    """Records operators that make a GPU wait for the host: a scalar read (item, float, bool,
    int), nonzero / masked_select, and indexing with a boolean mask (sized by a nonzero)."""

    SYNCING = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique2"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket._qualified_op_name.replace("::", ".")
        flat = [a for a in (args[1] if name == "aten.index" and len(args) > 1 else []) if isinstance(a, torch.Tensor)]
        if name in self.SYNCING or any(t.dtype == torch.bool for t in flat):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "family,objective,profile,flavor",
    [
        ("gpt", "clm", "gpt2", "tiny"),
        ("gpt1", "clm", "gpt2", "gpt1-tiny"),
        ("bert", "mlm", "bert", "bert-tiny"),
        ("bert", "mlm_nsp", "bert", "bert-tiny"),
        ("roberta", "mlm", "roberta", "roberta-tiny"),
        ("albert", "sop", "albert", "albert-tiny"),
        ("electra", "electra", "bert", "electra-tiny"),
        ("t5", "span_corruption", "t5", "t5-tiny"),
        ("bart", "denoising", "roberta", "bart-tiny"),
        ("xlnet", "plm", "xlnet", "xlnet-tiny"),
        ("elmo", "bilm", "word", "elmo-tiny"),
    ],
)
def test_a_micro_batch_makes_no_host_sync(family, objective, profile, flavor, shards):
    from glm_dist.data.loader import Loader
    from glm_dist.families.registry import build_model, resolve_model_config
    from glm_dist.objectives.registry import get_objective

    loader = Loader(shards(profile), objective=objective, seq_len=64, micro_batch_size=4)
    batch = loader.next_step()[0]
    model = build_model(family, resolve_model_config(family, flavor, vocab_size=loader.vocab.size, n_layer=1))
    with HostSyncs() as syncs:
        loss, sums = get_objective(objective).loss(model, batch, metrics=False)
        loss.backward()
    assert sums == {} and not syncs.seen, syncs.seen


def test_masked_positions_loss_equals_the_full_fp32_loss(shards):
    from glm_dist.data.loader import Loader
    from glm_dist.objectives.base import selected_nll

    batch = Loader(shards("bert"), objective="mlm", seq_len=64, micro_batch_size=4).next_step()[0]
    logits = torch.randn(*batch["input_ids"].shape, 3000, dtype=torch.bfloat16)
    nll, count, _, _ = selected_nll(logits, batch)
    full = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), reduction="sum")
    assert int(count) == int((batch["labels"] != -100).sum()) > 0
    assert torch.allclose(nll, full, rtol=1e-6)


COUNT_SCRIPT = r"""
import json, sys, torch.distributed as dist
from glm_dist.config.loader import load_config
from glm_dist.train.loop import Trainer

calls = []
for name in ("all_reduce", "all_gather", "broadcast", "barrier", "reduce_scatter"):
    real = getattr(dist, name)
    def wrapped(*a, _real=real, _name=name, **k):
        caller = sys._getframe(1).f_code.co_filename
        if "glm_dist" in caller:
            calls.append(_name)
        return _real(*a, **k)
    setattr(dist, name, wrapped)
trainer = Trainer(load_config(sys.argv[1], sys.argv[2:]))
per_step = []
for _ in range(3):
    before = len(calls)
    trainer.train_step()
    per_step.append(calls[before:])
print("CALLS" + json.dumps(per_step))
"""


def test_one_all_reduce_per_optimizer_step(shards_dir, tmp_path):
    """Loss, bad-step flag and stop flag share one all-reduce per step, whatever the accumulation;
    GLM_FORCE_COLLECTIVES=1 makes a world of one run it (what one GPU's check exercises)."""
    env = {**clean_env(2), "GLM_FORCE_COLLECTIVES": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            COUNT_SCRIPT,
            TINY,
            *FAST,
            f"data.shards_dir={shards_dir}",
            f"train.out_dir={tmp_path}",
            "train.grad_accum_steps=4",
            "train.max_steps=3",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    per_step = json.loads(proc.stdout.split("CALLS", 1)[1])
    assert per_step == [["all_reduce"]] * 3, per_step
