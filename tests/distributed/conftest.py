import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the test session (per xdist worker; every test here cleans up
    its actors and placement groups); its workers import this repo (test rewards) and run at
    normal priority, as in the cluster a run starts (:class:`~diffrl.distributed.ray.cluster.Cluster`):
    at Ray's default niceness 15 a worker gets ~3% of a core against a busy process at the
    default priority (the kernel's weights: 36 against 1024), and the loaded test run of issue 32's
    first pass had not finished after 35 minutes."""
    ray = pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        _system_config={"worker_niceness": 0},
    )
    yield
    ray.shutdown()
