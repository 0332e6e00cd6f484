import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the test session (per xdist worker; every test here cleans up
    its actors and placement groups); its workers import this repo (test rewards)."""
    ray = pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    yield
    ray.shutdown()
