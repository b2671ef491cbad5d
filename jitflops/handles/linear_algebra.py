"""Matrix products. One multiply-add counts as one flop; the bias (``addmm``'s ``self``) is not counted.

Composite products (``tensordot``, ``inner``, ``multi_dot``, ``matrix_power``, ``cov``) are counted
as the products torch runs for them, so the JIT, which records the composite op, and the dispatch
backend, which records what it decomposes into, give the same number. In-place forms (``addmm_``,
``baddbmm_``, ...) count as their out-of-place ops.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

from ..core.errors import OpShapeError
from ..core.records import OpRecord, TensorMeta
from .decompositions import inverse_macs
from .einsum import Sizes, sumproduct_pair_macs
from .registry import FLOP_FORMULAS, with_inplace
from .shapes import prod


def matmul_macs(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Multiply-adds of ``torch.matmul(a, b)`` for any ranks, 1-D operands and broadcast batch dims included.

    A 1-D left operand is a row vector, a 1-D right operand a column vector, as in ``torch.matmul``.
    """
    if not a or not b:
        raise ValueError(f"matmul of a 0-d tensor: {a} @ {b}")
    left = (1, a[0]) if len(a) == 1 else a
    right = (b[0], 1) if len(b) == 1 else b
    (n, k), (k_right, m) = left[-2:], right[-2:]
    if k != k_right:
        raise ValueError(f"inner dimensions differ: {a} @ {b}")
    batch = torch.broadcast_shapes(left[:-2], right[:-2])
    return prod(batch) * n * k * m


def _checked_matmul(op: OpRecord, left: str, right: str) -> int:
    try:
        return matmul_macs(op.shape(left), op.shape(right))
    except ValueError as error:
        raise OpShapeError(op.kind, op.scope, str(error)) from None


@FLOP_FORMULAS.register("aten::matmul", "aten::mm", "aten::bmm", "aten::dot", "aten::mv", "aten::vdot", "aten::_sparse_mm", "aten::_sparse_mm_reduce_impl")
def matmul_flops(op: OpRecord) -> int:
    """``self @ other`` (mm: ``self @ mat2``; mv: ``self @ vec``; dot, vdot: the vector product).

    Sparse products are counted as dense ones: a count from shapes cannot know the stored elements.
    """
    names = op.arg_names or ()
    right = next(name for name in ("other", "mat2", "vec", "tensor", "dense") if name in names)
    if "sparse" in names or op.kind == "aten::_sparse_mm_reduce_impl":  # the tracer records no sparse shape
        dense = op.shape(right)
        return op.output_numel() * dense[-2 if len(dense) > 1 else 0]
    return _checked_matmul(op, "self", right)


@FLOP_FORMULAS.register("aten::_sparse_mm_reduce_impl_backward")
def sparse_mm_reduce_backward_flops(op: OpRecord) -> int:
    """One product of the forward's size per gradient asked for (``output_mask``): the sparse
    operand's (``grad_out @ weight.T`` at its stored elements) and the weight's
    (``self.T @ grad_out``), counted dense as the forward is."""
    rows, columns = op.shape("grad_out")
    return sum(op.arg("output_mask")) * rows * op.shape("weight")[0] * columns


@FLOP_FORMULAS.register(*with_inplace("addmm addmv addbmm"), "aten::sparse_sampled_addmm")
def addmm_flops(op: OpRecord) -> int:
    """``beta * self + mat1 @ mat2``: the product only (addmv: ``mat @ vec``; addbmm: summed ``batch1 @ batch2``)."""
    names = op.arg_names or ()
    if "mat1" in names:
        return _checked_matmul(op, "mat1", "mat2")
    if "vec" in names:
        return _checked_matmul(op, "mat", "vec")
    return _checked_matmul(op, "batch1", "batch2")


@FLOP_FORMULAS.register(*with_inplace("baddbmm"))
def baddbmm_flops(op: OpRecord) -> int:
    """``beta * self + batch1 @ batch2``: the batched product only."""
    return _checked_matmul(op, "batch1", "batch2")


@FLOP_FORMULAS.register(*with_inplace("addr"), "aten::outer", "aten::ger")
def outer_flops(op: OpRecord) -> int:
    """An outer product (``addr``: added to ``self``): one multiply per output element."""
    left, right = ("vec1", "vec2") if op.has_arg("vec1") else ("self", "vec2")
    return prod(op.shape(left)) * prod(op.shape(right))


@FLOP_FORMULAS.register("aten::_scaled_mm", "aten::_scaled_mm_v2")
def scaled_mm_flops(op: OpRecord) -> int:
    """A low-precision ``self @ mat2`` with scales: the product."""
    return _checked_matmul(op, "self", "mat2")


@FLOP_FORMULAS.register("aten::_grouped_mm", "aten::_scaled_grouped_mm")
def grouped_mm_flops(op: OpRecord) -> int:
    """Products of groups (mixture-of-experts layers): every row meets its group's matrix once.

    ``self`` 2-D and ``mat2`` 3-D: the rows of ``self`` are split between the groups by ``offs``
    and each row is multiplied by one ``K x N`` matrix, so ``rows x K x N`` whatever the split.
    Both 3-D: a batched product. Both 2-D: the ``K`` dimension is split into groups, each giving an
    ``M x N`` output, together ``M x K x N``. ``self`` 3-D and ``mat2`` 2-D: each group's ``M x K``
    block meets its share of the columns. In every case ``output elements x K``, except that the
    split-``K`` form spends ``K`` once over all groups.
    """
    a, b = op.shape("self"), op.shape("mat2")
    if len(a) == 2 and len(b) == 2:
        return prod(a) * b[-1]
    return op.output_numel() * a[-1]


@FLOP_FORMULAS.register("transformers::grouped_mm_fallback")
def transformers_grouped_mm_flops(op: OpRecord) -> int:
    """transformers' grouped product of experts where torch's ``_grouped_mm`` cannot run: a custom
    op, whole in an exported graph (the other front ends see its ``mm`` per expert), ``input``'s
    rows each meeting their expert's ``K x N`` weight: ``rows x K x N``."""
    return op.output_numel() * op.shape("input")[-1]


@FLOP_FORMULAS.register("aten::linear")
def linear_flops(op: OpRecord) -> int:
    """``input @ weight.T``: every input row meets every output feature."""
    weight = op.shape("weight")
    out_features = weight[0] if len(weight) == 2 else 1
    return prod(op.shape("input")) * out_features


@FLOP_FORMULAS.register("aten::inner")
def inner_flops(op: OpRecord) -> int:
    """Sums over the last dim of both operands; a 0-d operand makes it a ``mul`` (not counted)."""
    a, b = op.shape("self"), op.shape("other")
    if not a or not b:
        return 0
    if a[-1] != b[-1]:
        raise OpShapeError(op.kind, op.scope, f"last dimensions differ: {a} and {b}")
    return prod(a) * prod(b[:-1])


def _products_in(run: Callable[[], Any]) -> bool:
    """Whether ``run`` dispatches a product kernel (``dot``, ``mm``, ...) rather than only elementwise ones."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Kernels(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.names.add(func._overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with _Kernels() as kernels:
        run()
    return bool(kernels.names & {"dot", "vdot", "mm", "bmm", "matmul"})


@functools.lru_cache(maxsize=None)
def _full_contraction_is_a_product(in_order: bool) -> bool:
    """Whether this torch runs a ``tensordot`` with no free elements over several dims as a product
    (``dot`` or ``mm``) or as ``mul`` and ``sum``: asked of torch once for contracted dims in the
    same order on both sides and once for others (torch 2.13 runs the first as ``dot``, the second
    as ``mul`` and ``sum``), by the kernels it dispatches for a 2 x 2 example."""
    dims = ([0, 1], [0, 1]) if in_order else ([0, 1], [1, 0])
    return _products_in(lambda: torch.tensordot(torch.ones(2, 2), torch.ones(2, 2), dims=dims))


@FLOP_FORMULAS.register("aten::tensordot")
def tensordot_flops(op: OpRecord) -> int:
    """One ``mm`` of the free dims of ``self`` by those of ``other`` over the contracted dims, as torch
    runs it: a contracted dim of size 1 on one side is summed out first; with no free elements on
    either side it is a ``dot`` over one contracted dim, and over several what this torch runs."""
    a, b = op.shape("self"), op.shape("other")
    dims_a, dims_b = [d % len(a) for d in op.arg("dims_self")], [d % len(b) for d in op.arg("dims_other")]
    kept = [(i, j) for i, j in zip(dims_a, dims_b) if a[i] != 1 and b[j] != 1]
    contracted = prod(a[i] for i, _ in kept)
    free_a = prod(size for d, size in enumerate(a) if d not in dims_a)
    free_b = prod(size for d, size in enumerate(b) if d not in dims_b)
    if free_a == free_b == 1 and len(kept) > 1:
        in_order = all(first < second for first, second in zip(kept, kept[1:]) for first, second in ((first[0], second[0]), (first[1], second[1])))
        if not _full_contraction_is_a_product(in_order):
            return 0
    return free_a * contracted * free_b


@FLOP_FORMULAS.register("aten::linalg_vecdot")
def vecdot_flops(op: OpRecord) -> int:
    """Dot products along ``dim`` of the broadcast operands: one multiply-add per element."""
    return prod(torch.broadcast_shapes(op.shape("x"), op.shape("y")))


def chain_macs(shapes: Sequence[tuple[int, ...]]) -> int:
    """Multiply-adds of ``linalg.multi_dot``: the cheapest order of the chain, which torch chooses by
    the same dynamic programme (a 1-D first or last operand is a row or column vector)."""
    if len(shapes) < 2:
        return 0
    first, last = shapes[0], shapes[-1]
    dims = [1 if len(first) == 1 else first[0]] + [shape[0] if len(shape) == 2 else 1 for shape in shapes[1:-1]]
    dims += [last[0], 1 if len(last) == 1 else last[1]]
    count = len(shapes)
    cost = [[0] * count for _ in range(count)]
    for length in range(1, count):
        for i in range(count - length):
            j = i + length
            cost[i][j] = min(cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1] for k in range(i, j))
    return cost[0][count - 1]


@FLOP_FORMULAS.register("aten::linalg_multi_dot", "aten::chain_matmul")
def multi_dot_flops(op: OpRecord) -> int:
    tensors = op.arg("tensors" if op.has_arg("tensors") else "matrices")
    if not isinstance(tensors, list) or not all(isinstance(t, TensorMeta) and t.shape is not None for t in tensors):
        raise OpShapeError(op.kind, op.scope, f"operand shapes were not recorded: {tensors!r}")
    return chain_macs([t.shape for t in tensors])


def matrix_power_products(n: int) -> int:
    """How many matrix products torch's ``matrix_power`` runs: binary powering, with 2 and 3 direct."""
    n = abs(n)
    if n < 2:
        return 0
    return n.bit_length() - 1 + bin(n).count("1") - 1


@FLOP_FORMULAS.register("aten::linalg_matrix_power", "aten::matrix_power")
def matrix_power_flops(op: OpRecord) -> int:
    """Products of square matrices; a negative power first inverts the matrix (counted as ``linalg_inv``)."""
    shape = op.shape("self")
    *batch, size, _ = shape
    n = op.arg("n")
    inverse = inverse_macs(shape) if n < 0 else 0
    return inverse + matrix_power_products(n) * prod(batch) * size ** 3


@FLOP_FORMULAS.register("aten::cov", "aten::corrcoef")
def covariance_flops(op: OpRecord) -> int:
    """``(x - mean) @ (x - mean).T`` for ``x`` of variables by observations."""
    shape = op.shape("self")
    variables = shape[0] if len(shape) == 2 else 1
    return variables * variables * shape[-1]


def trilinear_macs(
    shapes: Sequence[tuple[int, ...]], expands: Sequence[Sequence[int]], sumdim: Sequence[int], unroll_dim: int
) -> int:
    """Multiply-adds of torch's ``_trilinear``: ``(i1 * i2)`` summed over the dims ``i3`` lacks, then
    that times ``i3`` summed over the rest, each a ``sumproduct_pair``; the unrolled dim is a batch
    dim of both products."""
    rank = len(shapes[0]) + len(expands[0])
    operands: list[Sizes] = []
    for shape, expand in zip(shapes, expands):
        sizes = iter(shape)
        operands.append({str(d): 1 if d in expand else next(sizes) for d in range(rank)})
    first, second, third = operands
    summed_first = {str(d) for d in sumdim if d in expands[2] and d != unroll_dim}
    summed_second = {str(d) for d in sumdim if d not in expands[2] and d != unroll_dim}
    macs, middle = sumproduct_pair_macs(first, second, summed_first)
    return macs + sumproduct_pair_macs(middle, third, summed_second)[0]


@FLOP_FORMULAS.register("aten::_trilinear")
def trilinear_flops(op: OpRecord) -> int:
    shapes = [op.shape(name) for name in ("i1", "i2", "i3")]
    expands = [op.arg(name) for name in ("expand1", "expand2", "expand3")]
    return trilinear_macs(shapes, expands, op.arg("sumdim"), op.arg("unroll_dim"))


@FLOP_FORMULAS.register("aten::bilinear")
def bilinear_flops(op: OpRecord) -> int:
    """``x1^T W x2`` per output feature, as torch runs it: ``_trilinear(x1, W, x2)`` on 2-D inputs."""
    first, second, weight = op.shape("input1"), op.shape("input2"), op.shape("weight")
    rows = prod(first[:-1])
    shapes = [(rows, first[-1]), weight, (rows, second[-1])]
    return trilinear_macs(shapes, [[1, 3], [0], [1, 2]], [2, 3], 1)


@FLOP_FORMULAS.register("torch_nn::_linear_cross_entropy_batch_chunked", "torch_nn::_linear_cross_entropy_batch_chunked_no_reduction")
def linear_cross_entropy_flops(op: OpRecord) -> int:
    """torch's chunked ``linear_cross_entropy``: the logits ``input @ linear_weight.T``, and the
    gradients it is asked to compute in the same pass (each a product of the same size)."""
    logits = prod(op.shape("input")) * op.shape("linear_weight")[0]
    gradients = sum(bool(op.arg_or(name, False)) for name in ("compute_input_grad", "compute_linear_weight_grad"))
    return logits * (1 + gradients)
