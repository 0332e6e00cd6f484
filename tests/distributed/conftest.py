import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster for one test module; its workers import this repo (test rewards)."""
    ray = pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    yield
    ray.shutdown()
