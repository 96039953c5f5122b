"""A training job that asks for a model-parallel placement gets a plan for the GPUs it is given."""

from __future__ import annotations

from plinth.core.errors import SpecError
from plinth.core.spec import spec_from_dict

READ_PLAN = ("import os; from plinth.place import Plan; "
             "p = Plan.load(os.environ['PLINTH_PLACEMENT_PLAN']); "
             "print('PLAN', p.algo, len(p.devices), sorted(set(p.assign.values())))")


def test_job_gets_a_plan_for_its_gpus(shared_platform) -> None:
    with shared_platform.client() as c:
        j = c.submit({"name": "mp", "command": ["python", "-c", READ_PLAN],
                      "resources": {"cpus": 0.1, "memory": "2Gi", "gpus": 2},
                      "placement": {"model": "tests.control.tiny_model:mlp", "algo": "m-topo",
                                    "batch": 16, "memory": "1Mi"}})
        assert c.wait(j, timeout=120) == "succeeded", c.logs(j)
        log = c.logs(j)
        assert "plinth: placed tests.control.tiny_model:mlp on 2 devices with m-topo" in log
        line = next(ln for ln in log.splitlines() if ln.startswith("PLAN"))
        assert line.split()[1:3] == ["m-topo", "2"]
        assert line.endswith("[0, 1]")  # 1 MiB per device: the model had to be split


def test_placement_spec_is_checked() -> None:
    base = {"name": "x", "command": ["true"]}
    for bad, field in (({"model": "no-colon"}, "placement.model"),
                       ({"model": "a:b", "algo": "greedy"}, "placement.algo"),
                       ({"model": "a:b", "batch": 0}, "placement.batch")):
        try:
            spec_from_dict({**base, "placement": bad}, kind="Job")
        except SpecError as e:
            assert field in str(e)
        else:
            raise AssertionError(f"accepted {bad}")
