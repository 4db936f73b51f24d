"""The delegation gate judges compute (FLOPs), not op counts: real XNNPACK lowering of tiny models.

A BERT-like encoder leaves most of its ops outside XNNPACK (mask building, expand/unsqueeze
copies, layer norms) and none of its matmul FLOPs: it must pass. The same encoder lowered with a
partitioner that takes no matmul leaves nearly the same share of ops delegated and every matmul
FLOP outside: it must fail, naming them.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

WIDTH, HEADS, SEQ = 64, 4, 16


class Layer(nn.Module):
    """Attention written out with the layout ops transformers emit (reshape/permute/expand/mask)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)

    def heads(self, x):
        return x.view(1, SEQ, HEADS, WIDTH // HEADS).transpose(1, 2)

    def forward(self, x, mask):
        keep = mask.unsqueeze(-1).expand(1, SEQ, WIDTH)  # padded positions are zeroed after each block
        q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
        blocked = mask.unsqueeze(1).unsqueeze(2).expand(1, HEADS, SEQ, SEQ).logical_not()
        scores = (q @ k.transpose(-1, -2)).masked_fill(blocked, -1e4)
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, SEQ, WIDTH).where(keep, 0.0)
        x = self.norm1(x + self.o(attended)).where(keep, 0.0)
        return self.norm2(x + self.down(nn.functional.gelu(self.up(x)))).where(keep, 0.0)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.position, self.kind = (nn.Embedding(n, WIDTH) for n in (100, SEQ, 2))
        self.layers = nn.ModuleList(Layer() for _ in range(2))
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, ids, mask):
        positions = torch.arange(SEQ).unsqueeze(0).expand(1, SEQ)
        x = self.embed(ids) + self.position(positions) + self.kind(torch.zeros_like(ids))
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(x.where(mask.unsqueeze(-1).expand(1, SEQ, WIDTH), 0.0)[:, 0])


def _lower(partitioner):
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    ids, mask = torch.randint(0, 100, (1, SEQ)), torch.ones(1, SEQ, dtype=torch.bool)
    mask[0, -3:] = False
    program = torch.export.export(Encoder().eval(), (ids, mask))
    return to_edge_transform_and_lower(program, partitioner=[partitioner])


def _gate(coverage: dict):
    """Why a program with ``coverage`` fails XNNPACK's gate (at least 50%), or None."""
    from etforge.checks.delegation import Delegation

    check = Delegation.of({**coverage, "backend": "xnnpack", "minimum": 0.5}).judged()
    return check.reason() if check.failed else None


@pytest.fixture(scope="module")
def encoder_coverage():
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.config.gemm_configs import AddmmConfig, LinearConfig
    from executorch.backends.xnnpack.partition.config.generic_node_configs import BMMConfig
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    from etforge.builders.gates.gates import delegation_coverage

    gemm = {AddmmConfig, LinearConfig, BMMConfig}
    no_matmuls = XnnpackPartitioner(configs=[c for c in ALL_PARTITIONER_CONFIGS if c not in gemm])
    good = _lower(XnnpackPartitioner())
    bad = _lower(no_matmuls)
    return (
        delegation_coverage(good.exported_program().graph_module),
        delegation_coverage(bad.exported_program().graph_module),
        good,
    )


def test_an_encoder_with_many_cheap_layout_ops_outside_passes(encoder_coverage):
    good, _, edge = encoder_coverage
    # Counted in ops, the encoder would fail the 50% gate: its layout and mask ops stay outside.
    assert good["delegation_coverage"] < 0.5, good
    assert {"aten.expand_copy", "aten.unsqueeze_copy"} <= set(good["not_delegated"])
    # Counted in compute, XNNPACK runs nearly all of it: every matmul is inside.
    assert good["compute_coverage"] >= 0.9, good
    assert good["delegated_flops"] + sum(good["flops_not_delegated"].values()) == good["flops"]
    assert not {"aten.mm", "aten.addmm", "aten.bmm", "aten.linear"} & set(good["not_delegated"])
    assert _gate(good) is None
    # measured before to_executorch (which rewrites the graph in place), and the program still builds
    assert len(edge.to_executorch().buffer) > 10_000


def test_a_program_whose_matmuls_run_on_portable_kernels_fails(encoder_coverage):
    good, bad, _ = encoder_coverage
    # The op share barely moves (a count gate could not tell the two apart) ...
    assert abs(bad["delegation_coverage"] - good["delegation_coverage"]) < 0.15, (good, bad)
    # ... while the compute share collapses, and the gate says where the FLOPs went.
    assert bad["compute_coverage"] < 0.1, bad
    assert abs(bad["flops"] - good["flops"]) < 0.1 * good["flops"]  # the same model (its linears decomposed)
    reason = _gate(bad)
    assert reason is not None and reason.startswith("backend 'xnnpack' runs ")
    assert "of the program's compute" in reason and "gate: at least 50%" in reason
    assert "aten.addmm" in reason or "aten.mm" in reason, reason
    assert "compute ops" in reason  # the op counts stay as information


def test_a_record_made_before_compute_was_measured_is_judged_on_its_op_share():
    reason = _gate({"delegation_coverage": 0.2, "compute_ops": 5, "delegated_compute_ops": 1, "not_delegated": {}})
    assert reason is not None and "took 1 of 5 compute ops (20%" in reason
    # and a compute share that is not a number fails (NaN-safe)
    assert _gate({"compute_coverage": float("nan"), "flops": 1, "delegated_flops": 0}) is not None


def test_the_report_shows_the_compute_share_and_the_op_counts():
    from etforge.checks.delegation import Delegation

    check = Delegation(compute_coverage=0.9916, delegation_coverage=0.4756, compute_ops=82, delegated_compute_ops=39)
    assert check.text() == "99.2%"
    assert check.detail() == "99.2% of the compute (FLOPs) delegated; 39 of 82 compute ops delegated (47.6%)"
    # a record made before compute was measured: the graph's node counts, as before
    old = Delegation(delegated_ops=3, non_delegated_ops=1)
    assert (old.text(), old.detail()) == ("75.0%", "3 delegated, 1 not delegated")


def test_a_program_with_dynamic_sizes_is_measured_at_its_example_sizes():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from etforge.builders.gates.gates import delegation_coverage

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    batch = torch.export.Dim("batch", min=1, max=32)
    program = torch.export.export(model, (torch.randn(3, 8),), dynamic_shapes=({0: batch},))
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    coverage = delegation_coverage(lowered.exported_program().graph_module)
    assert coverage["compute_coverage"] == 1.0 and coverage["flops"] == 1200
    portable = delegation_coverage(to_edge_transform_and_lower(program).exported_program().graph_module)
    assert portable["compute_coverage"] == 0.0 and portable["flops_not_delegated"]["aten.addmm"] == 2 * 3 * (
        8 * 16 + 16 * 4
    )
