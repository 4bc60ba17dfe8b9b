"""memory.plan: placements, best-fit offsets, in-place updates, copy-back, errors."""

import attrs
import pytest

from latch_core.document import dumps, loads, program_doc
from latch_core.passes import PassError, run_pass
from latch_core.sections import Access, ScheduleSection
from latch_memory.arena import assign_offsets
from latch_core.order import Order
from latch_memory.liveness import LivenessError, linear_order
from latch_memory.plan import plan as _plan
from latch_memory.plugin import PLAN
from latch_memory.testing import mlp_graph, naive_schedule, naive_schedule_section, test_registry, two_weight_graph

REG = test_registry()


def plan(doc, **kw):
    return _plan(doc, registry=REG, **kw)


def _doc(graph, **kw):
    doc = program_doc(graph)
    return attrs.evolve(doc, schedule=naive_schedule_section(doc, REG, **kw))


def _brute_force_safe(doc):
    """Every pair of arena placements sharing a byte: all users of one happen before all writers
    of the other, checked task pair by task pair (independent of the planner's vector summaries).
    A hand-off (one value written over another of the same placement and type) is checked box by
    box instead: each access of the old value happens before each overlapping write of the new
    one, or is a read by that same task of an all-elementwise group."""
    for pm in doc.memory.programs:
        ps = doc.schedule.program(pm.program)
        g = doc.graph.program(pm.program)
        c = Order.from_schedule(ps)
        users, writers, acc = {}, {}, {}
        for t in ps.tasks:
            for a in t.reads:
                users.setdefault(a.value, set()).add(t.id)
                acc.setdefault(a.value, []).append((t.id, "r", a.box))
            for a in t.writes:
                users.setdefault(a.value, set()).add(t.id)
                writers.setdefault(a.value, set()).add(t.id)
                acc.setdefault(a.value, []).append((t.id, "w", a.box))
        op_of = {n.name: n.op for n in g.nodes}

        def elementwise(t):
            return all("elementwise" in REG.get(op_of[n]).tags for n in ps.groups[ps.tasks[t].group].nodes)

        outs = set(g.output_names())
        arena = [p for p in pm.placements if p.buffer == "arena"]
        for i, a in enumerate(arena):
            for b in arena[i + 1:]:
                if not (a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes):
                    continue
                assert a.first >= 0 and b.first >= 0, f"constant {a.value}/{b.value} shares bytes"

                def ordered(x, y):
                    return x.value not in outs and all(c.before(u, w) for u in users[x.value] for w in writers[y.value])

                def handed_off(x, y):
                    if (x.offset, x.nbytes) != (y.offset, y.nbytes) or g.value(x.value).type != g.value(y.value).type \
                            or x.value in outs:
                        return False
                    for u, kind, ub in acc[x.value]:
                        for w, kind2, wb in acc[y.value]:
                            if kind2 != "w" or not all(l1 < h2 and l2 < h1 for (l1, h1), (l2, h2) in zip(ub, wb)):
                                continue
                            if not (c.before(u, w) or (u == w and kind == "r" and elementwise(u))):
                                return False
                    return True

                assert ordered(a, b) or ordered(b, a) or handed_off(a, b) or handed_off(b, a), \
                    f"{pm.program}: {a.value} and {b.value} share bytes unordered"


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_plans_are_safe_and_bounded(strategy, seed):
    for graph in (two_weight_graph(), mlp_graph(layers=3, batch=16, width=8)):
        doc = plan(_doc(graph, strategy=strategy, num_sms=3, tiles=4, seed=seed))
        _brute_force_safe(doc)
        m = doc.memory
        assert m.alignment == 256
        for pm in m.programs:
            assert pm.arena_bytes >= pm.peak_live_bytes > 0
            for p in pm.placements:
                if p.buffer == "arena":
                    assert p.offset % 256 == 0 and p.offset + p.nbytes <= pm.arena_bytes
        # the arena is reused: smaller than giving every value its own aligned slot
        total = sum(-(-p.nbytes // 256) * 256 for pm in m.programs for p in pm.placements if p.buffer == "arena")
        assert m.arena_bytes < total


def test_placement_rules():
    doc = plan(_doc(two_weight_graph(), strategy="barrier", num_sms=2, tiles=2))
    pm = doc.memory.program("update")
    where = {p.value: p for p in pm.placements}
    assert where["w1"].buffer == "w1" and where["x"].buffer == "x" and where["lr"].buffer == "lr"
    assert where["w1_new"].buffer == "w1" and where["w1_new"].offset == 0  # in place
    assert where["w2_new"].buffer == "w2"
    assert where["half"].buffer == "arena" and where["half"].offset == 0 and where["half"].first == -1
    assert where["loss"].buffer == "arena" and where["loss"].last == -1  # live on exit
    assert where["pre"].buffer == "arena" and where["pre"].first >= 0 and where["pre"].last >= 0
    # every value a task touches, and every program input/output, has exactly one placement
    ps = doc.schedule.program("update")
    touched = {a.value for t in ps.tasks for a in t.reads + t.writes}
    names = [p.value for p in pm.placements]
    assert len(names) == len(set(names))
    assert touched <= set(names)
    st = dict(dict(dict(doc.memory.stats)["programs"])["update"])
    assert st["inplace"] == ("w1_new", "w2_new") and st["copy_back"] == ()
    # dh dies into dpre = relu_grad(pre, dh), each tile reading the rows it writes: a hand-off
    assert where["dpre"].offset == where["dh"].offset and st["arena_handoffs"] >= 1


def _widen_sgd_reads(ps, old):
    """Make every task of the update of ``old`` read the whole of ``old`` (a legal superset)."""
    full = None
    tasks = []
    for t in ps.tasks:
        reads = []
        for a in t.reads:
            if a.value == old and ps.groups[t.group].nodes[0].startswith(f"n_{old}_new"):
                full = full or tuple((0, hi) for _, hi in t.writes[0].box[:1]) + t.writes[0].box[1:]
                reads.append(Access(old, tuple((0, d) for d in _shape_of(ps, old))))
            else:
                reads.append(a)
        tasks.append(attrs.evolve(t, reads=reads))
    return attrs.evolve(ps, tasks=tasks)


def _shape_of(ps, value):
    for t in ps.tasks:
        for a in t.reads:
            if a.value == value and a.box[0][0] == 0:
                return [hi for _, hi in a.box]
    raise AssertionError(value)


def test_unsafe_inplace_gets_an_arena_slot_and_copy_back():
    graph = two_weight_graph()
    doc = _doc(graph, strategy="barrier", num_sms=2, tiles=2)
    ps = doc.schedule.program("update")
    # w1 is read whole by the matmul (full box), so the shape is known; now the update's two tiles
    # each read all of w1 while the other tile writes w1_new: no in-place update possible
    ps = _widen_sgd_reads(ps, "w1")
    doc = attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[ps]))
    out = plan(doc)
    pm = out.memory.program("update")
    where = {p.value: p for p in pm.placements}
    assert where["w1_new"].buffer == "arena" and where["w1_new"].last == -1
    assert where["w2_new"].buffer == "w2"
    stats = dict(out.memory.stats)
    assert stats["copy_back"] == (("update", "w1_new", "w1"),)
    reasons = dict(dict(dict(stats["programs"])["update"])["copy_back_reasons"])
    assert "unordered with task" in reasons["w1_new"]
    _brute_force_safe(out)


def test_inplace_needs_a_pointwise_body_for_a_self_read():
    # the same schedule, but the update op is not known to be elementwise: its task reads w1 and
    # writes w1_new over the same elements, which only a pointwise body may do
    from latch_core.registry import Registry

    reg = Registry("op")
    for name, spec in REG.items():
        reg.add(name, attrs.evolve(spec, tags=frozenset()) if name == "test::sgd" else spec, "memtest")
    out = _plan(_doc(two_weight_graph(), strategy="barrier", num_sms=2, tiles=2), registry=reg)
    stats = dict(out.memory.stats)
    assert stats["copy_back"] == (("update", "w1_new", "w1"), ("update", "w2_new", "w2"))
    reasons = dict(dict(dict(stats["programs"])["update"])["copy_back_reasons"])
    assert "through more than elementwise ops" in reasons["w1_new"]
    _brute_force_safe(out)


def test_dataflow_reuse_needs_happens_before():
    # Two independent chains on two SMs, no sync between them: disjoint in the linear order,
    # but unordered, so their values must not share bytes.
    from latch_core.ir import Graph, Group, Node, Value
    from latch_core.sections import Counter, FusionGroup, ProgramSchedule, Task

    # (rmsnorm, not elementwise: b cannot simply take over a's bytes, nor d c's)
    vals = [Value("x", (64,), "f32", "batch")] + [Value(n, (64,), "f32") for n in ("a", "b", "c", "d")]
    nodes = [Node("na", "test::relu", ("x",), ("a",)), Node("nb", "test::rmsnorm", ("a",), ("b",)),
             Node("nc", "test::relu", ("x",), ("c",)), Node("nd", "test::rmsnorm", ("c",), ("d",))]
    g = Graph("p", vals, nodes, [Group("batch", ("x",))], [Group("out", ("b", "d"))])
    full = ((0, 64),)
    groups = [FusionGroup(i, (n.name,), n.inputs, n.outputs, n.outputs[0], n.op) for i, n in enumerate(nodes)]
    tasks = [Task(i, i, full, [Access(n.inputs[0], full)], [Access(n.outputs[0], full)]) for i, n in enumerate(nodes)]
    sms = [[("task", 0), ("task", 1)], [("task", 2), ("task", 3)]]
    ps = ProgramSchedule("p", groups, tasks, sms, [Counter(0, 0)])
    doc = attrs.evolve(program_doc(g), schedule=ScheduleSection("dataflow", 2, [ps]))
    out = plan(doc)
    pm = out.memory.program("p")
    where = {p.value: p for p in pm.placements}
    spans = [(where[n].offset, where[n].offset + 256) for n in "abcd"]
    # a and c are each read by an unordered task of the other chain's era: all four distinct
    assert len({s for s in spans}) == 4
    _brute_force_safe(out)
    # the lower bound sees it too: one order has at most three values live at once, but all four
    # pairwise conflict
    st = dict(dict(dict(out.memory.stats)["programs"])["p"])
    assert st["peak_live_bytes_one_order"] == 3 * 256 and pm.peak_live_bytes == 4 * 256 == pm.arena_bytes


def test_best_fit_picks_the_smallest_gap():
    # 'a', 'sep1', 'sep2' live throughout; 'x' (512) and 'y' (256) die before 'z' (256) starts:
    # z fits both freed gaps and takes the smaller one, y's
    items = [("a", 2048, 0, 9), ("x", 512, 0, 1), ("sep1", 256, 0, 9), ("y", 256, 0, 1), ("sep2", 256, 0, 9),
             ("z", 256, 2, 3)]
    offs, top = assign_offsets(items, alignment=256)
    assert offs == {"a": 0, "x": 2048, "sep1": 2560, "y": 2816, "sep2": 3072, "z": 2816}
    assert top == 3328
    # an ordering oracle that refuses: z must go above everything
    offs, top = assign_offsets(items, ordered=lambda a, b: False, alignment=256)
    assert offs["z"] == 3328 and top == 3584
    # alignment: a 100-byte item still starts on a 256 boundary
    offs, top = assign_offsets([("p", 100, 0, 1), ("q", 100, 0, 1)], alignment=256)
    assert sorted(offs.values()) == [0, 256] and top == 356


def test_errors_name_the_culprit():
    doc = _doc(two_weight_graph(), strategy="barrier")
    ps = doc.schedule.program("update")
    bad = attrs.evolve(ps.tasks[0], writes=[Access("nope", ((0, 1),))])
    ps2 = attrs.evolve(ps, tasks=(bad,) + ps.tasks[1:])
    with pytest.raises(LivenessError, match="names value 'nope'.*task 0"):
        plan(attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[ps2])))
    # drop the producer of 'h': its readers now read a value nobody writes
    groups_h = {g.id for g in ps.groups if "h" in g.outputs}
    ps3 = attrs.evolve(ps, tasks=[attrs.evolve(t, writes=[]) if t.group in groups_h else t for t in ps.tasks])
    with pytest.raises(LivenessError, match="value 'h' is read by task .* but no task writes it"):
        plan(attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[ps3])))
    with pytest.raises(PassError, match="requires section.*schedule"):
        run_pass(PLAN, program_doc(two_weight_graph()))


def test_pass_round_trips_through_the_document():
    doc = run_pass(PLAN, _doc(mlp_graph(), strategy="dataflow"), alignment=512, registry=REG)
    assert doc.memory.alignment == 512
    assert doc.provenance[-1].name == "memory.plan"
    again = loads(dumps(doc))
    assert again.memory == doc.memory


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
def test_naive_schedules_order_every_read_after_its_writers(strategy):
    # the test scheduler the other tests lean on must itself be right
    for g in (two_weight_graph(), mlp_graph(layers=2)):
        ps = naive_schedule(g, REG, strategy=strategy, num_sms=3, tiles=3, seed=5)
        order = Order.from_schedule(ps)
        writers = {}
        for t in ps.tasks:
            for a in t.writes:
                writers.setdefault(a.value, []).append(t.id)
        for t in ps.tasks:
            for a in t.reads:
                assert all(order.before(w, t.id) for w in writers.get(a.value, ())), (a.value, t.id)
        # and the planner's linear order is an extension of happens-before
        pos = {t: i for i, t in enumerate(linear_order(order, len(ps.tasks)))}
        n = len(ps.tasks)
        assert sorted(pos) == list(range(n))
        assert all(pos[a] < pos[b] for a in range(n) for b in range(n) if order.before(a, b))


def test_planner_and_validator_share_one_order():
    # latch_core.order memoizes by schedule identity: planning does not rebuild what another
    # stage of the same pipeline already built
    doc = _doc(mlp_graph(), strategy="dataflow")
    ps = doc.schedule.program("update")
    first = Order.from_schedule(ps)
    planned = plan(doc)
    assert Order.from_schedule(planned.schedule.program("update")) is first
