import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the test session (every test here cleans up its actors and
    placement groups); its workers import this repo (test rewards)."""
    ray = pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        # Ray starts one idle worker per CPU when the driver connects: 8 processes of ~350 MB
        # importing Ray on a 2-core machine, that the tests' actors (own processes) never use
        _system_config={"prestart_worker_first_driver": False},
    )
    yield
    ray.shutdown()
