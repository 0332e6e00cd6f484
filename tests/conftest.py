import os
import signal
from pathlib import Path

import pytest

from diffrl.core.pins import wanted_environment

# Every test process computes with deterministic mode's library pins from its start (before torch:
# MKL and oneDNN read them once), as the diffrl command does, so a run in a test's process and one
# in a diffrl subprocess (a crash test's resume, the reproducibility gate) agree to the bit.
for _key, _value in wanted_environment().items():
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
"""The tests' Ray clusters (loopback only) run without Ray 2.60's token auth, set before any Ray
import: a process's auth mode is cached in Ray's config when Ray first reads it, and the kill -9
test forks its driver from a pytest worker, so a worker that had read the mode before its own
``ray.init`` enabled tokens gave a child whose requests carried no token to a cluster that wanted
one (seen once: "Missing authorization header", GCS never reached). On a fresh machine two workers
would also race to create ``~/.ray/auth_token``. A run's own cluster keeps Ray's default."""

REFERENCE = Path(__file__).parent / "data" / "reference"
ROOT = Path(__file__).resolve().parent.parent


THREADS = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
"""torch threads per test process: the cores this process may use, shared by xdist's workers
(``-n 2`` in pyproject.toml: two workers of two threads each would oversubscribe 2 cores)."""


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS)


WHOLE_DISTRIBUTED_MODULES = {"tests/distributed/test_sglang_engine.py"}
"""Ray modules kept in one worker anyway: their module fixtures (a server, a reference run) are
the expensive part."""


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist: a module's tests run in one worker, so its module fixtures (a model, a
    run to resume against) are built once. The Ray tests (tests/distributed) are the longest and
    share only a session cluster: each is scheduled on its own, so both workers take them (each
    worker starts its cluster when its first Ray test needs one).

    A scheduler of our own, not ``xdist_group`` marks: xdist 3.8 groups by appending ``@group`` to
    ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is ``item._id``), so with the
    lock's versions ``--dist loadgroup`` silently scheduled every test on its own."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module.startswith("tests/distributed/") and module not in WHOLE_DISTRIBUTED_MODULES:
                return nodeid
            return module

    return ModuleScheduling(config, log)


GATE = "reproducibility gate"
"""The ``user_properties`` key under which the reproducibility gate's tests say which check ran and why."""


def pytest_terminal_summary(terminalreporter):
    """The reproducibility gate's line(s) at the end of the run, whatever ran (the exact comparison
    or the near check, and why): it never passes or stops comparing without saying so."""
    said = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()):
                if key == GATE:
                    said[value] = None
    for line in said:
        terminalreporter.write_line(f"{GATE}: {line}")


@pytest.fixture
def reference_dir() -> Path:
    return REFERENCE


def rehash_checkpoint(checkpoint: Path) -> None:
    """Record the files' current sha256 in ``checkpoint.json`` and seal it again: for tests that edit
    a checkpoint's files (or its ``checkpoint.json``) on purpose and need it to read as if it had
    been written so."""
    import hashlib
    import json

    from diffrl.train.manifest import seal

    info_file = checkpoint / "checkpoint.json"
    info = json.loads(info_file.read_text())
    info["files"] = {n: hashlib.sha256((checkpoint / n).read_bytes()).hexdigest() for n in info["files"]}
    info_file.write_text(json.dumps(seal(info)))


SMALL_ROLLOUT = {
    "rollout.batch_size": 2,
    "rollout.n_samples_per_prompt": 4,
    "rollout.micro_group_size": 4,
    "rollout.num_steps_per_rollout": 1,
    "train.batch_size": 8,
    "train.micro_batch_size": 4,
}
"""The RL tests' rollout: 2 prompts x 4 samples in micro-groups of 4, one optimizer step of all 8
in micro-batches of 4."""


TINY_RUN = {
    "model.path": "random",
    "sampling.num_steps": 2,
    "sampling.guidance_scale": 1.0,
    "rollout.batch_size": 2,
    "rollout.n_samples_per_prompt": 2,
    "rollout.micro_group_size": 2,
    "rollout.num_steps_per_rollout": 1,
    "train.batch_size": 4,
    "train.micro_batch_size": 2,
}
"""The smallest run of the random tiny model, for the tests of what happens around a run (faults,
crashes, plugins): 2 prompts x 2 samples of 2 steps, one optimizer step of the 4 in micro-batches
of 2. As ``key=value`` overrides: :func:`overrides`."""


def overrides(settings: dict[str, object]) -> list[str]:
    """``settings`` as the command line's ``key=value`` overrides."""
    return [f"{k}={v}" for k, v in settings.items()]


def tiny_overrides(tmp_path: Path, **extra) -> list[str]:
    """Small, fast settings for end-to-end runs on a random tiny model."""
    base = {
        "run.output_dir": str(tmp_path / "run"),
        "model.path": "random",
        "train.iterations": 2,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "sampling.num_steps": 2,
        "sampling.guidance_scale": 1.0,  # tests that exercise CFG set it themselves
        "eval.num_prompts": 2,
        "eval.batch_size": 2,
        "eval.rewards": "[{name: ocr, params: {num_workers: 0}}]",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture
def terminal_sigint():
    """SIGINT handled as in a terminal (Python's own handler) for the test. A test run started in
    the background (``cmd &`` from a script, nohup, some CI runners) inherits SIGINT ignored, and
    Python then installs no handler: a Ctrl-C test would see nothing arrive."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` of a subprocess that must see Ctrl-C: SIGINT's default action again (see
    :func:`terminal_sigint`), so its Python installs its handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint of the ``tiny`` family (one SFT step from a random init): what the real
    families' tests hand to another family to see it refused."""
    from diffrl.launch import train
    from diffrl.preflight import load_config

    out = tmp_path_factory.mktemp("tiny_checkpoint")
    config = load_config(
        str(ROOT / "recipes" / "tiny_sft.yaml"),
        [
            f"run.output_dir={out}",
            "model.path=random",
            "train.iterations=1",
            "train.batch_size=2",
            "train.micro_batch_size=2",
            "eval.enabled=false",
            "data.dataset_size=4",
        ],
    )
    return train(config).checkpoint
