"""FGD: hand-checked fragmentation, the vectorised scores against a literal reading of the paper,
a case where FGD keeps a whole GPU usable and best fit does not, no over-commit, determinism."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plinth.core import Allocation, Cluster, Node, Request, WorkerSlot
from plinth.core.errors import SpecError
from plinth.core.resources import MILLI
from plinth.sched.fgd import (
    WorkloadProfile,
    choose_gpu,
    choose_node,
    cluster_fragmentation,
    node_fragmentation,
    place_pod,
)
from plinth.sched.placement import PlacementConfig, place, place_and_allocate
from plinth.sched.state import ClusterState


def use(state, node, gpu, milli, *, cpu=0, mem=0, gpu_mem=0):
    """Occupy `milli` of one GPU (and some of its node's CPU and memory)."""
    req = Request(gpu_milli=milli, gpu_memory_mib=gpu_mem, cpus_milli=cpu, memory_mib=mem)
    state.allocate(Allocation((WorkerSlot(node, (gpu,), milli, gpu_mem),)), req)


def fgd(profile):
    return PlacementConfig(fractional="fgd", profile=profile)


# -- a literal reading of the paper, for checking the vectorised code ---------------------------

def ref_shape_frag(state, n, shape):
    """F_n(m) as the paper defines it, one GPU at a time."""
    c = state.cluster
    lo, size = int(c.node_first_gpu[n]), c.nodes[n].num_gpus
    free = [int(x) for x in state.gpu_free_milli[lo:lo + size]]
    mem = [int(x) for x in state.gpu_free_mem[lo:lo + size]]
    total = sum(free)
    needs_gpu = shape.gpus > 0 or shape.gpu_milli > 0
    if (needs_gpu and not (size and shape.allows(c.nodes[n].gpu_model))
            or state.node_free_cpu[n] < shape.cpus_milli
            or state.node_free_mem[n] < shape.memory_mib):
        return total
    if shape.fractional:
        ok = [f >= shape.gpu_milli and m >= shape.gpu_memory_mib for f, m in zip(free, mem)]
        need = 1
    elif shape.gpus:
        ok = [f == MILLI for f in free]
        need = shape.gpus
    else:
        return 0
    if sum(ok) < need:
        return total
    return sum(f for f, good in zip(free, ok) if not good)


def ref_node_frag(state, n, profile):
    """sum_m w_m F_n(m), in integer weights (so exact)."""
    return sum(int(w) * ref_shape_frag(state, n, s)
               for s, w in zip(profile.shapes, profile.weights))


def ref_choose_gpu(state, req, cand, profile):
    c = state.cluster
    best = None
    for g in cand:
        n = int(c.gpu_node[g])
        before = ref_node_frag(state, n, profile)
        after_state = state.copy()
        use(after_state, n, int(g), req.gpu_milli, cpu=req.cpus_milli, mem=req.memory_mib,
            gpu_mem=req.gpu_memory_mib)
        key = (ref_node_frag(after_state, n, profile) - before, int(state.gpu_free_milli[g]),
               int(g))
        best = key if best is None or key < best else best
    return best[2]


def ref_choose_node(state, req, nodes, profile):
    c = state.cluster
    best = None
    for n in nodes:
        before = ref_node_frag(state, n, profile)
        after = state.copy()
        lo = int(c.node_first_gpu[n])
        free = np.flatnonzero(state.gpu_free_milli[lo:lo + c.nodes[n].num_gpus] == MILLI)
        after.allocate(Allocation((WorkerSlot(int(n), tuple((free[:req.gpus] + lo).tolist())),)),
                       req)
        fit = state.node_free_whole[n] if req.gpus else state.node_free_cpu[n]
        key = (ref_node_frag(after, n, profile) - before, int(fit), int(n))
        best = key if best is None or key < best else best
    return best[2]


# -- hand-checked values --------------------------------------------------------------------------

def two_gpu_node():
    c = Cluster((Node("n0", 8_000, 32_768, "V100", 2),))
    s = ClusterState(c)
    use(s, 0, 0, 700)  # GPU 0 has 300 free
    use(s, 0, 1, 200)  # GPU 1 has 800 free
    return s


WHOLE = Request(gpus=1, cpus_milli=1_000)
HALF = Request(gpu_milli=500)
FIFTH = Request(gpu_milli=200)
CPU_HEAVY = Request(gpu_milli=100, cpus_milli=10_000)  # more CPU than the node has
T4_ONLY = Request(gpu_milli=100, gpu_models=("T4",))


@pytest.mark.parametrize("shape, expected", [
    (WHOLE, 1_100),  # no GPU is entirely free: the pod cannot run, all 300 + 800 is fragment
    (HALF, 300),  # runs on GPU 1; GPU 0's 300 free cannot hold 500
    (FIFTH, 0),  # both GPUs can hold 200
    (CPU_HEAVY, 1_100),  # not enough CPU: all free GPU share is fragment
    (T4_ONLY, 1_100),  # wrong GPU model
    (Request(gpus=2), 1_100),
    (Request(cpus_milli=1_000), 0),  # a CPU-only pod that fits wastes no GPU
])
def test_fragmentation_of_one_shape_on_a_two_gpu_node(shape, expected):
    s = two_gpu_node()
    profile = WorkloadProfile((shape,), (1,))
    assert node_fragmentation(s, profile).tolist() == [expected]


def test_fragmentation_is_the_popularity_weighted_sum():
    s = two_gpu_node()
    profile = WorkloadProfile((WHOLE, HALF, FIFTH, CPU_HEAVY), (2, 1, 1, 4))
    # (2 * 1100 + 1 * 300 + 1 * 0 + 4 * 1100) / 8
    assert node_fragmentation(s, profile).tolist() == [862.5]
    assert cluster_fragmentation(s, profile) == 862.5


def test_an_empty_node_has_no_fragment_for_shapes_that_fit():
    s = ClusterState(Cluster((Node("n0", 8_000, 32_768, "V100", 2),)))
    profile = WorkloadProfile((WHOLE, HALF, Request(gpus=2)), (1, 1, 1))
    assert node_fragmentation(s, profile).tolist() == [0.0]
    # A 4-GPU pod can never run on a 2-GPU node: all 2000 free milli is fragment for it.
    assert node_fragmentation(s, WorkloadProfile((Request(gpus=4),), (1,))).tolist() == [2_000]


def test_gpu_memory_counts_toward_what_a_gpu_can_hold():
    c = Cluster((Node("n0", 8_000, 32_768, "V100", 2),))
    s = ClusterState(c)
    use(s, 0, 0, 100, gpu_mem=30_000)  # 900 free share but only 2768 MiB GPU memory left
    shape = Request(gpu_milli=300, gpu_memory_mib=4_096)
    assert node_fragmentation(s, WorkloadProfile((shape,), (1,))).tolist() == [900]


def test_choice_delta_on_the_two_gpu_node():
    # Profile: mostly 500-milli pods. A 300-milli pod on GPU 0 (300 free) uses that sliver
    # exactly (fragment 300 -> 0); on GPU 1 it leaves 500 free, still usable. GPU 0 wins.
    s = two_gpu_node()
    profile = WorkloadProfile((HALF,), (1,))
    assert choose_gpu(s, Request(gpu_milli=300), np.array([0, 1]), profile) == 0
    # A 400-milli pod fits only GPU 1 and leaves 400 < 500: fragment grows by 400 there.
    assert choose_gpu(s, Request(gpu_milli=400), np.array([1]), profile) == 1


# -- FGD against best fit -----------------------------------------------------------------------

def test_fgd_keeps_a_whole_gpu_usable_where_best_fit_does_not():
    # Node A: one GPU half used, one GPU free, and only 6 cores left. Node B: one GPU with 600
    # free, the other busy. The expected pods are mostly 1-GPU pods with 4 cores each.
    c = Cluster((Node("a", 16_000, 65_536, "V100", 2), Node("b", 16_000, 65_536, "V100", 2)))
    s = ClusterState(c)
    use(s, 0, 0, 500, cpu=10_000)
    use(s, 1, 2, 400)
    use(s, 1, 3, 1_000 - 1)  # busy (a sliver of 1 milli left)
    whole = Request(gpus=1, cpus_milli=4_000)
    pod = Request(gpu_milli=500, cpus_milli=3_000)
    profile = WorkloadProfile((whole, pod), (9, 1))

    bf = place(s, pod)
    assert bf.slots[0].gpus == (0,), "best fit: the fullest GPU that fits is A's GPU 0"
    bf_state = s.copy()
    bf_state.allocate(bf, pod)
    assert place(bf_state, whole) is None, "A has 3 cores left: its free GPU is stranded"

    a = place(s, pod, fgd(profile))
    assert a.slots[0].gpus == (2,), "FGD takes B's partly used GPU"
    s.allocate(a, pod)
    assert place(s, whole, fgd(profile)) is not None, "A's whole GPU is still usable"


def test_fgd_weighs_all_gpu_models_at_once():
    # Best fit tries models in cluster order and breaks the P100's whole GPU; FGD uses the
    # V100's half-used GPU and keeps the whole one for the 1-GPU pods that dominate.
    c = Cluster((Node("p", 16_000, 65_536, "P100", 1), Node("v", 16_000, 65_536, "V100", 1)))
    s = ClusterState(c)
    use(s, 1, 1, 500)
    pod = Request(gpu_milli=400)
    profile = WorkloadProfile((Request(gpus=1), pod), (9, 1))
    assert place(s, pod).slots[0].gpus == (0,)
    assert place(s, pod, fgd(profile)).slots[0].gpus == (1,)
    # A policy that pins the model is obeyed.
    assert place(s, pod, fgd(profile), models=("P100",)).slots[0].gpus == (0,)


def test_whole_gpu_pod_does_not_break_a_pair():
    # Node 0 has 2 free GPUs, node 1 has 3 (and one busy). Best fit puts a 1-GPU pod on node 0,
    # leaving a single GPU that the 2-GPU pods of the profile cannot use (fragment 0 -> 1000);
    # on node 1 the remaining 2 GPUs still hold a 2-GPU pod (fragment stays 0).
    c = Cluster((Node("b", 32_000, 65_536, "V100", 2), Node("a", 32_000, 65_536, "V100", 4)))
    s = ClusterState(c)
    s.allocate(Allocation((WorkerSlot(1, (5,)),)), Request(gpus=1))
    profile = WorkloadProfile((Request(gpus=2), Request(gpus=1)), (3, 1))
    pod = Request(gpus=1)
    assert place(s, pod).slots[0].node == 0
    a = place(s, pod, fgd(profile))
    assert a.slots[0].node == 1 and len(a.slots[0].gpus) == 1
    assert a.slots[0].node == ref_choose_node(s, pod, np.array([0, 1]), profile)


def test_cpu_only_pods_avoid_starving_gpu_nodes():
    # Best fit puts a 6-core pod on the node with the least free CPU, the 8-core GPU node, and
    # leaves it 2 cores: too few for the 4-core 1-GPU pods, so both its GPUs are stranded.
    # FGD sees that the CPU-only node has no GPU to fragment and uses it.
    c = Cluster((Node("cpu", 32_000, 65_536), Node("gpu", 8_000, 65_536, "V100", 2)))
    s = ClusterState(c)
    cpu_pod = Request(cpus_milli=6_000)
    profile = WorkloadProfile((Request(gpus=1, cpus_milli=4_000), cpu_pod), (5, 1))
    assert place(s, cpu_pod).slots[0].node == 1
    assert place(s, cpu_pod, fgd(profile)).slots[0].node == 0


# -- vectorised == literal --------------------------------------------------------------------

MODELS = ("V100", "T4")

shapes = st.one_of(
    st.builds(lambda m, c: Request(gpu_milli=m, cpus_milli=c),
              st.sampled_from([100, 250, 300, 500, 700, 900]), st.sampled_from([0, 2_000, 6_000])),
    st.builds(lambda g, c: Request(gpus=g, cpus_milli=c),
              st.sampled_from([1, 2, 4]), st.sampled_from([0, 4_000])),
    st.builds(lambda c: Request(cpus_milli=c), st.sampled_from([1_000, 12_000])),
    st.builds(lambda m: Request(gpu_milli=m, gpu_models=("T4",)), st.sampled_from([200, 600])),
    st.builds(lambda m: Request(gpu_milli=m, gpu_memory_mib=8_192), st.sampled_from([200, 400])),
)


@st.composite
def scenes(draw):
    """A small cluster, some random prior use, and a random profile."""
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        gpus = draw(st.sampled_from([0, 1, 2, 4]))
        nodes.append(Node(f"n{i}", draw(st.sampled_from([8_000, 16_000])), 65_536,
                          draw(st.sampled_from(MODELS)) if gpus else None, gpus))
    if not any(n.num_gpus for n in nodes):
        nodes.append(Node("g", 16_000, 65_536, "V100", 2))
    s = ClusterState(Cluster(tuple(nodes)))
    c = s.cluster
    for _ in range(draw(st.integers(0, 8))):
        g = draw(st.integers(0, c.total_gpus - 1))
        free = int(s.gpu_free_milli[g])
        if free == 0:
            continue
        n = int(c.gpu_node[g])
        milli = draw(st.integers(1, free))
        cpu = min(draw(st.sampled_from([0, 2_000, 4_000])), int(s.node_free_cpu[n]))
        gpu_mem = min(draw(st.sampled_from([0, 4_096, 12_000])), int(s.gpu_free_mem[g]))
        use(s, n, g, milli, cpu=cpu, gpu_mem=gpu_mem)
    picked = draw(st.lists(shapes, min_size=1, max_size=5, unique=True))
    weights = draw(st.lists(st.integers(1, 9), min_size=len(picked), max_size=len(picked)))
    return s, WorkloadProfile(tuple(picked), tuple(weights))


@given(scenes())
@settings(max_examples=150, deadline=None)
def test_node_fragmentation_matches_the_definition(scene):
    s, profile = scene
    total = sum(int(w) for w in profile.weights)
    got = node_fragmentation(s, profile)
    want = [ref_node_frag(s, n, profile) / total for n in range(len(s.cluster.nodes))]
    assert got.tolist() == want


@given(scenes(), shapes)
@settings(max_examples=150, deadline=None)
def test_choices_match_the_literal_argmin(scene, req):
    s, profile = scene
    c = s.cluster
    ok = (s.node_free_cpu >= req.cpus_milli) & (s.node_free_mem >= req.memory_mib)
    ok &= np.array([bool(n.num_gpus) and req.allows(n.gpu_model) for n in c.nodes]) \
        if (req.gpus or req.gpu_milli) else True
    if req.fractional:
        cand = np.flatnonzero((s.gpu_free_milli >= req.gpu_milli)
                              & (s.gpu_free_mem >= req.gpu_memory_mib) & ok[c.gpu_node])
        if cand.size:
            assert choose_gpu(s, req, cand, profile) == ref_choose_gpu(s, req, cand, profile)
    else:
        nodes = np.flatnonzero(ok & (s.node_free_whole >= req.gpus))
        if nodes.size:
            assert choose_node(s, req, nodes, profile) == ref_choose_node(s, req, nodes, profile)


# -- safety and determinism ---------------------------------------------------------------------

requests = st.one_of(
    st.builds(lambda m, c, gm, w: Request(gpu_milli=m, cpus_milli=c, gpu_memory_mib=gm,
                                          workers=w),
              st.integers(1, 999), st.integers(0, 8_000), st.sampled_from([0, 2_048, 20_000]),
              st.sampled_from([1, 1, 1, 2])),
    st.builds(lambda g: Request(gpus=g, cpus_milli=2_000), st.sampled_from([1, 2])),
    st.builds(lambda c: Request(cpus_milli=c, memory_mib=4_096), st.integers(0, 8_000)),
)


@given(st.lists(requests, min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_fgd_never_over_commits(reqs):
    c = Cluster((Node("a", 32_000, 131_072, "V100", 4), Node("b", 16_000, 65_536, "T4", 2),
                 Node("c", 8_000, 32_768)))
    s = ClusterState(c)
    cfg = fgd(WorkloadProfile.from_requests(reqs))
    for r in reqs:
        a = place_and_allocate(s, r, cfg)  # allocate itself raises on an over-commit
        s.check()
        if a is not None:
            assert len(a.slots) == r.workers
            for slot in a.slots:
                assert r.allows(c.nodes[slot.node].gpu_model) or not (r.gpus or r.gpu_milli)


def test_deterministic_and_independent_of_candidate_order():
    rng = np.random.default_rng(7)
    c = Cluster(tuple(Node(f"n{i}", 64_000, 262_144, "V100", 8) for i in range(16)))
    reqs = [Request(gpu_milli=int(m), cpus_milli=2_000) if m < MILLI else Request(gpus=1)
            for m in rng.choice([200, 300, 500, 700, 1_000], size=150)]
    cfg = fgd(WorkloadProfile.from_requests(reqs))

    def run():
        s = ClusterState(c)
        return [place_and_allocate(s, r, cfg) for r in reqs], s

    first, s = run()
    assert first == run()[0]
    pod = Request(gpu_milli=100)
    cand = np.flatnonzero(s.gpu_free_milli >= 100)
    assert choose_gpu(s, pod, cand, cfg.profile) == choose_gpu(s, pod, cand[::-1], cfg.profile)


def test_place_pod_rejects_a_gang():
    s = ClusterState(Cluster((Node("n0", 8_000, 32_768, "V100", 2),)))
    with pytest.raises(ValueError):
        place_pod(s, Request(gpus=1, workers=2), WorkloadProfile((WHOLE,), (1,)))


def test_fractional_gang_under_fgd_uses_distinct_capacity():
    s = ClusterState(Cluster((Node("n0", 8_000, 32_768, "V100", 2),)))
    a = place_and_allocate(s, Request(gpu_milli=600, workers=2),
                           fgd(WorkloadProfile((HALF,), (1,))))
    assert sorted(g for slot in a.slots for g in slot.gpus) == [0, 1]
    s.check()


# -- the profile ------------------------------------------------------------------------------

def test_profile_groups_shapes_and_counts_workers():
    reqs = [Request(gpus=1), Request(gpus=1, preferred_gpu_model="V100"),
            Request(gpu_milli=500, workers=3), Request(gpu_milli=500, gpu_models=("T4", "A10")),
            Request(gpu_milli=500, gpu_models=("A10", "T4"))]
    p = WorkloadProfile.from_requests(reqs)
    assert p.shapes[0] == Request(gpu_milli=500)  # 3 pods, the most popular
    assert dict(zip(p.shapes, p.weights)) == {
        Request(gpu_milli=500): 3, Request(gpus=1): 2,
        Request(gpu_milli=500, gpu_models=("A10", "T4")): 2,
    }
    assert p.probabilities.sum() == pytest.approx(1.0)
    assert p.num_classes == 2  # 500-milli pods and 1-GPU pods


def test_profile_is_frozen_and_hashable():
    a = WorkloadProfile.from_requests([Request(gpus=1), Request(gpu_milli=300)])
    b = WorkloadProfile.from_requests([Request(gpu_milli=300), Request(gpus=1)])
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert hash(PlacementConfig(fractional="fgd", profile=a)) == hash(fgd(b))
    with pytest.raises(AttributeError):
        a.weights = (1.0,)  # type: ignore[misc]


def test_profile_accepts_probabilities_and_rejects_nonsense():
    p = WorkloadProfile((WHOLE, HALF), (0.75, 0.25))
    assert p.probabilities.tolist() == [0.75, 0.25]
    s = two_gpu_node()
    assert node_fragmentation(s, p).tolist() == pytest.approx([0.75 * 1_100 + 0.25 * 300])
    with pytest.raises(SpecError, match="positive"):
        WorkloadProfile((WHOLE,), (0.0,))
    with pytest.raises(SpecError, match="weights"):
        WorkloadProfile((WHOLE, HALF), (1,))
    with pytest.raises(SpecError, match="one pod"):
        WorkloadProfile((Request(gpus=1, workers=2),), (1,))
    with pytest.raises(SpecError, match="no requests"):
        WorkloadProfile.from_requests([])
