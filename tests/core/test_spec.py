"""Cluster loading: YAML specs, Alibaba node lists, shorthands, and their one-line errors."""

from __future__ import annotations

import pytest

from plinth.core.errors import SpecError
from plinth.core.spec import (
    dump_cluster_yaml,
    load_cluster,
    parse_memory,
    parse_shorthand,
)

LAB = """\
name: lab
nodes_per_rack: 4
nodes:
  - {name: v100, count: 6, gpus: 8, gpu_model: V100, cpus: 64, memory: 512Gi, labels: {zone: a}}
  - {name: p100, count: 2, gpus: 4, gpu_model: p100, cpus: 31.5, memory: 262144, rack: r9}
  - {name: cpu, gpus: 0, cpus: 8, memory: 64Gi}
tenants:
  - {name: team-a, nominal_gpus: 32, borrowing_limit: 16, cohort: default, weight: 2}
  - {name: team-b, nominal_gpus: 24}
"""


def write(tmp_path, text, name="lab.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def error_of(arg) -> str:
    with pytest.raises(SpecError) as e:
        load_cluster(arg)
    msg = str(e.value)
    assert "\n" not in msg, "errors are one line"
    return msg


def test_yaml_spec(tmp_path):
    c = load_cluster(write(tmp_path, LAB))
    assert c.name == "lab" and len(c.nodes) == 9 and c.total_gpus == 6 * 8 + 2 * 4
    assert [n.name for n in c.nodes[:2]] == ["v100-000", "v100-001"] and c.nodes[-1].name == "cpu"
    v = c.nodes[0]
    assert (v.cpus_milli, v.memory_mib, v.gpu_model, v.labels) == (64000, 512 * 1024, "V100",
                                                                    (("zone", "a"),))
    p = c.nodes[6]
    assert (p.gpu_model, p.cpus_milli, p.memory_mib, p.rack) == ("P100", 31500, 262144, "r9")
    # auto racks count nodes globally, four to a rack; an explicit rack wins
    assert [n.rack for n in c.nodes] == ["rack-0"] * 4 + ["rack-1"] * 2 + ["r9", "r9", "rack-2"]
    assert c.nodes[-1].num_gpus == 0 and c.nodes[-1].gpu_model is None
    a, b = c.tenants
    assert (a.name, a.nominal_gpus, a.borrowing_limit, a.weight) == ("team-a", 32, 16, 2)
    assert (b.borrowing_limit, b.cohort, b.weight) == (None, "default", 1.0)


def test_yaml_dump_round_trip(tmp_path):
    c = load_cluster(write(tmp_path, LAB))
    again = load_cluster(write(tmp_path, dump_cluster_yaml(c), "again.yaml"))
    assert again.nodes == c.nodes and again.tenants == c.tenants and again.name == c.name


@pytest.mark.parametrize("text, expected", [
    # negative GPUs: the file, the line, the path to the field, the bound and the value
    ("nodes:\n  - {name: a, gpus: 8, gpu_model: V100}\n  - {name: b, gpus: -2, gpu_model: V100}\n",
     "lab.yaml:3: nodes[1].gpus: must be >= 0 (got -2)"),
    ("nodes:\n  - {name: a, gpus: 8, gpu_model: V100, gpuz: 1}\n",
     "lab.yaml:2: nodes[0].gpuz: unknown field; allowed fields: name, count"),
    ("nodez: []\n", "lab.yaml:1: nodez: unknown field"),
    ("nodes:\n  - {name: a, gpus: 8, gpu_model: V200}\n",
     "lab.yaml:2: nodes[0].gpu_model: unknown GPU model 'V200'; known models: H200"),
    ("nodes:\n  - {name: a, gpus: 8}\n", "lab.yaml:2: nodes[0]: gpu_model is required"),
    ("nodes:\n  - {name: a, gpus: 8, gpu_model: V100, memory: 12GB}\n",
     "lab.yaml:2: nodes[0].memory: expected MiB or a size like 512Gi"),
    ("nodes:\n  - {name: a, gpus: eight, gpu_model: V100}\n", "lab.yaml:2: nodes[0].gpus: "),
    ("nodes:\n  - {name: a, gpus: 8, gpu_model: V100}\ntenants:\n  - {name: t, nominal_gpus: -1}\n",
     "lab.yaml:4: tenants[0].nominal_gpus: must be >= 0 (got -1)"),
    ("nodes:\n  - {gpus: 8, gpu_model: V100}\n",
     "lab.yaml:2: nodes[0].name: required field is missing"),
    ("nodes:\n  - {name: a, gpus: 0}\n  - {name: b}\n", "lab.yaml: cluster cluster: has no GPUs"),
    ("nodes:\n  - {name: a, gpus: 1, gpu_model: T4}\n  - {name: a, gpus: 1, gpu_model: T4}\n",
     "lab.yaml: cluster cluster: node name 'a' appears twice"),
    ("- just\n- a list\n", "lab.yaml: expected a mapping"),
    ("name: x\nnodes: [\n  {name: a,\n  gpus: 8: 9}\n", "lab.yaml:4: invalid YAML"),
])
def test_yaml_errors(tmp_path, text, expected):
    msg = error_of(write(tmp_path, text))
    assert expected in msg


def test_alibaba_node_list(tmp_path):
    path = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\n"
                           "n0,32000,262144,0,\n"
                           + "".join(f"n{i},96000,786432,8,V100M32\n" for i in range(1, 18))
                           + "n18,64000,262144,2,t4\n", "nodes.csv")
    c = load_cluster(path)
    assert len(c.nodes) == 18 and c.nodes[0].name == "n1"  # the CPU-only node is skipped
    assert c.nodes[0].cpus_milli == 96000 and c.nodes[-1].gpu_model == "T4"
    assert c.nodes[15].rack == "rack-0" and c.nodes[16].rack == "rack-1"  # racks of 16
    assert c.name == "nodes"


def test_alibaba_node_list_errors(tmp_path):
    bad = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,lots,8,V100\n", "n.csv")
    assert f"{bad}:2: memory_mib: expected an integer, got 'lots'" in error_of(bad)
    missing = write(tmp_path, "sn,cpu_milli,gpu,model\n", "m.csv")
    assert f"{missing}:1: missing column 'memory_mib'" in error_of(missing)
    model = write(tmp_path, "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,8,X9\n", "x.csv")
    assert f"{model}:2: model: unknown GPU model 'X9'" in error_of(model)


def test_shorthand():
    c = load_cluster("16x8xV100,8x8xP100,8x4xK80")
    assert c.total_gpus == 16 * 8 + 8 * 8 + 8 * 4 and c.models == ("V100", "P100", "K80")
    n = c.nodes[0]
    assert (n.name, n.cpus_milli, n.memory_mib, n.rack) == ("v100-000", 64000, 512 * 1024, "rack-0")
    assert c.nodes[8].rack == "rack-1" and c.nodes[16].name == "p100-000"
    # two groups of one model keep counting, so node names stay unique
    assert [x.name for x in parse_shorthand("1x8xv100,1x4xV100").nodes] == ["v100-000", "v100-001"]


@pytest.mark.parametrize("arg, expected", [
    ("32x8V100", "cluster '32x8V100': cannot read '32x8V100'"),
    ("32x8xV10", "cluster '32x8xV10': unknown GPU model 'V10'; known models:"),
    ("16x8xV100,,", "cluster '16x8xV100,,': cannot read ''"),
    ("0x8xV100", "count and GPUs must be >= 1"),
    ("lab.yaml", "lab.yaml: no such file"),
    ("nodes.csv", "nodes.csv: no such file"),
])
def test_bad_arguments(arg, expected):
    assert expected in error_of(arg)


def test_parse_memory():
    assert parse_memory(1024) == 1024 and parse_memory("2Gi") == 2048
    assert parse_memory("1Ti") == 1024 * 1024 and parse_memory("512Mi") == 512
    assert parse_memory("1.5Gi") == 1536
    for bad in ("12GB", "-1Gi", "", True):
        with pytest.raises(ValueError):
            parse_memory(bad)
