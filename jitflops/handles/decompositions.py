"""Linear-algebra decompositions and solvers: the standard LAPACK operation counts.

The counts are the dense flop counts of Golub & Van Loan, *Matrix Computations* (4th ed., tables
of sections 4.2, 5.2, 5.5, 8.6) and LAPACK Working Note 41, halved into multiply-adds to fit
jitflops' convention (one multiply-add = one flop). For an ``m x n`` matrix (``n x n`` where
square), ``k`` right-hand sides, per batch element:

* Cholesky ``n^3/6``; its inverse ``n^3/3``; LDL ``n^3/6``; LU ``(m n^2 - n^3/3)/2`` (``m >= n``);
* a solve from a factorisation ``n^2 k`` (a triangular one ``n^2 k / 2``); ``solve`` = LU + solve;
* inverse ``n^3``; determinant = LU;
* Householder QR ``m n^2 - n^3/3`` for R, as much again for a thin Q;
* symmetric eigen-decomposition ``2n^3/3`` (values) or ``9n^3/2`` (vectors); general ``5n^3`` or
  ``25n^3/2``;
* SVD (Golub-Reinsch, ``m >= n``) ``2mn^2 - 2n^3/3`` (values), ``7mn^2 + 4n^3`` (thin U, V),
  ``2m^2 n + 4mn^2 + 9n^3/2`` (full U, V);
* a hermitian square root (torch 2.15's ``linalg.matrix_sqrth``) the eigen-decomposition and one
  product; the polar decomposition (``linalg.polar``) a thin SVD and two products;
* ``matrix_exp``: five ``n^3`` products, the degree-18 Taylor evaluation torch uses for all but
  the smallest norms (the squarings depend on the norm, a value, and are not counted).

Norms and condition numbers cost what they compute with: the spectral and nuclear norms an SVD,
the others (elementwise sums) nothing. The composite ops the JIT records (``linalg_solve``,
``linalg_inv``, ``linalg_det``, ``svd``, ...) count as the kernels the dispatch backend sees them
run (``_linalg_solve_ex``, ``linalg_inv_ex``, ``_linalg_det``, ``_linalg_svd``, ...).
"""

from __future__ import annotations

from ..core.records import OpRecord
from .registry import FLOP_FORMULAS
from .shapes import prod


def _batch_m_n(shape: tuple[int, ...]) -> tuple[int, int, int]:
    *batch, m, n = shape
    return prod(batch), m, n


def lu_macs(shape: tuple[int, ...]) -> float:
    batch, m, n = _batch_m_n(shape)
    long, short = max(m, n), min(m, n)
    return batch * (long * short**2 - short**3 / 3) / 2


def inverse_macs(shape: tuple[int, ...]) -> int:
    batch, n, _ = _batch_m_n(shape)
    return batch * n**3


def _right_hand_sides(a: tuple[int, ...], b: tuple[int, ...], left: bool = True) -> tuple[int, int]:
    """(batch, k) of ``b`` against the square ``a``: a vector ``b`` is one right-hand side."""
    if len(b) == len(a) - 1:
        return max(prod(a[:-2]), prod(b[:-1])), 1
    batch = max(prod(a[:-2]), prod(b[:-2]))
    return batch, (b[-1] if left else b[-2])


def _solve_with_factors_macs(a: tuple[int, ...], b: tuple[int, ...], left: bool = True) -> int:
    batch, k = _right_hand_sides(a, b, left)
    return batch * a[-1] ** 2 * k


def qr_macs(shape: tuple[int, ...], mode: str) -> float:
    """``mode``: ``"r"`` (R only), ``"reduced"`` (thin Q) or ``"complete"``."""
    batch, m, n = _batch_m_n(shape)
    k = min(m, n)
    r_only = (2 * m * n * k - 2 * k**3 / 3) / 2 if m >= n else (2 * n * m**2 - 2 * m**3 / 3) / 2
    if mode == "r":
        return batch * r_only
    columns = k if mode == "reduced" else m
    return batch * (r_only + householder_product_macs(m, columns, k))


def householder_product_macs(m: int, n: int, k: int) -> float:
    """LAPACK's ``orgqr``: the first ``n`` columns of ``Q`` from ``k`` reflectors of length ``m``."""
    return (4 * m * n * k - 2 * (m + n) * k**2 + 4 * k**3 / 3) / 2


def svd_macs(shape: tuple[int, ...], vectors: bool, full: bool) -> float:
    batch, m, n = _batch_m_n(shape)
    m, n = max(m, n), min(m, n)
    if not vectors:
        return batch * (2 * m * n**2 - 2 * n**3 / 3)
    if full:
        return batch * (2 * m**2 * n + 4 * m * n**2 + 9 * n**3 / 2)
    return batch * (7 * m * n**2 + 4 * n**3)


def eigh_macs(shape: tuple[int, ...], vectors: bool) -> float:
    batch, n, _ = _batch_m_n(shape)
    return batch * n**3 * (9 / 2 if vectors else 2 / 3)


def eig_macs(shape: tuple[int, ...], vectors: bool) -> float:
    batch, n, _ = _batch_m_n(shape)
    return batch * n**3 * (25 / 2 if vectors else 5)


def _matrix(op: OpRecord) -> tuple[int, ...]:
    """The decomposed matrix: the first argument (``self``, ``A`` or ``input``)."""
    return op.operand_shape()


@FLOP_FORMULAS.register("aten::cholesky", "aten::linalg_cholesky", "aten::linalg_cholesky_ex", "aten::linalg_ldl_factor", "aten::linalg_ldl_factor_ex")
def cholesky_flops(op: OpRecord) -> int:
    batch, n, _ = _batch_m_n(_matrix(op))
    return round(batch * n**3 / 6)


@FLOP_FORMULAS.register("aten::cholesky_inverse")
def cholesky_inverse_flops(op: OpRecord) -> int:
    batch, n, _ = _batch_m_n(_matrix(op))
    return round(batch * n**3 / 3)


@FLOP_FORMULAS.register(
    "aten::linalg_lu_factor", "aten::linalg_lu_factor_ex", "aten::linalg_lu", "aten::_lu_with_info",
    "aten::linalg_det", "aten::_linalg_det", "aten::det", "aten::logdet", "aten::linalg_slogdet", "aten::_linalg_slogdet", "aten::slogdet",
)
def lu_flops(op: OpRecord) -> int:
    """An LU factorisation (determinants are read off it)."""
    return round(lu_macs(_matrix(op)))


@FLOP_FORMULAS.register("aten::linalg_inv", "aten::linalg_inv_ex", "aten::inverse")
def inverse_flops(op: OpRecord) -> int:
    return inverse_macs(_matrix(op))


@FLOP_FORMULAS.register("aten::linalg_tensorinv")
def tensorinv_flops(op: OpRecord) -> int:
    shape = op.shape("self")
    return prod(shape[op.arg("ind"):]) ** 3


@FLOP_FORMULAS.register("aten::linalg_solve", "aten::linalg_solve_ex", "aten::_linalg_solve_ex")
def solve_flops(op: OpRecord) -> int:
    """LU of ``A``, then a solve for the columns (``left``) or rows of ``B``."""
    a, b = op.shape("A"), op.shape("B")
    return round(lu_macs(a)) + _solve_with_factors_macs(a, b, op.arg_or("left", True))


@FLOP_FORMULAS.register("aten::linalg_tensorsolve")
def tensorsolve_flops(op: OpRecord) -> int:
    n = prod(op.shape("other"))
    return round(lu_macs((n, n))) + n * n


@FLOP_FORMULAS.register("aten::linalg_lu_solve", "aten::lu_solve", "aten::cholesky_solve", "aten::linalg_ldl_solve")
def solve_with_factors_flops(op: OpRecord) -> int:
    """Two triangular solves with a factorisation already made."""
    names = op.arg_names or ()
    factors, rhs = next((f, r) for f, r in (("LU", "B"), ("LD", "B"), ("LU_data", "self"), ("input2", "self")) if f in names)
    return _solve_with_factors_macs(op.shape(factors), op.shape(rhs), op.arg_or("left", True))


@FLOP_FORMULAS.register("aten::linalg_solve_triangular", "aten::triangular_solve")
def triangular_solve_flops(op: OpRecord) -> int:
    a, b = (op.shape("self"), op.shape("B")) if op.kind == "aten::linalg_solve_triangular" else (op.shape("A"), op.shape("self"))
    return _solve_with_factors_macs(a, b, op.arg_or("left", True)) // 2


@FLOP_FORMULAS.register("aten::geqrf", "aten::linalg_qr", "aten::qr")
def qr_flops(op: OpRecord) -> int:
    if op.kind == "aten::geqrf":
        mode = "r"
    elif op.kind == "aten::qr":
        mode = "reduced" if op.arg_or("some", True) else "complete"
    else:
        mode = op.arg_or("mode", "reduced")
    return round(qr_macs(_matrix(op), mode))


@FLOP_FORMULAS.register("aten::linalg_householder_product", "aten::orgqr")
def householder_product_flops(op: OpRecord) -> int:
    batch, m, n = _batch_m_n(_matrix(op))
    return round(batch * householder_product_macs(m, n, op.shape("tau")[-1]))


@FLOP_FORMULAS.register("aten::ormqr")
def ormqr_flops(op: OpRecord) -> int:
    """``Q`` (``k`` reflectors) applied to ``C`` (``input3``, ``m x n``) from the left or right."""
    batch, m, n = _batch_m_n(op.shape("input3"))
    k = op.shape("input2")[-1]
    left = op.arg_or("left", True)
    return round(batch * (4 * m * n * k - 2 * (n if left else m) * k**2) / 2)


@FLOP_FORMULAS.register("aten::linalg_lstsq")
def lstsq_flops(op: OpRecord) -> int:
    """QR of ``A``, ``Q^T B`` and a triangular solve (LAPACK's ``gelsy``, torch's CPU default)."""
    a, b = op.shape("self"), op.shape("b")
    batch, m, n = _batch_m_n(a)
    k = 1 if len(b) == len(a) - 1 else b[-1]
    short = min(m, n)
    return round(qr_macs(a, "r") + batch * ((4 * m * k * short - 2 * k * short**2) / 2 + short**2 * k / 2))


@FLOP_FORMULAS.register("aten::_linalg_svd", "aten::linalg_svd", "aten::svd", "aten::linalg_svdvals")
def svd_flops(op: OpRecord) -> int:
    if op.kind == "aten::linalg_svdvals":
        vectors, full = False, False
    elif op.kind == "aten::svd":
        vectors, full = op.arg_or("compute_uv", True), not op.arg_or("some", True)
    else:
        vectors, full = op.arg_or("compute_uv", True), op.arg_or("full_matrices", op.kind == "aten::linalg_svd")
    return round(svd_macs(_matrix(op), vectors, full))


@FLOP_FORMULAS.register("aten::_linalg_eigh", "aten::linalg_eigh", "aten::linalg_eigvalsh")
def eigh_flops(op: OpRecord) -> int:
    vectors = op.kind == "aten::linalg_eigh" or (op.kind == "aten::_linalg_eigh" and op.arg_or("compute_v", True))
    return round(eigh_macs(_matrix(op), vectors))


@FLOP_FORMULAS.register("aten::linalg_eig", "aten::linalg_eigvals")
def eig_flops(op: OpRecord) -> int:
    return round(eig_macs(_matrix(op), op.kind == "aten::linalg_eig"))


@FLOP_FORMULAS.register("aten::linalg_pinv", "aten::pinverse")
def pinv_flops(op: OpRecord) -> int:
    """A thin SVD (an eigen-decomposition if hermitian) and the product ``V S^-1 U^T``."""
    shape = _matrix(op)
    batch, m, n = _batch_m_n(shape)
    decomposition = eigh_macs(shape, True) if op.arg_or("hermitian", False) else svd_macs(shape, True, False)
    return round(decomposition + batch * m * n * min(m, n))


@FLOP_FORMULAS.register("aten::linalg_matrix_rank")
def matrix_rank_flops(op: OpRecord) -> int:
    shape = _matrix(op)
    return round(eigh_macs(shape, False) if op.arg_or("hermitian", False) else svd_macs(shape, False, False))


_SPECTRAL_ORDERS = (2, -2, "nuc")


@FLOP_FORMULAS.register("aten::linalg_matrix_norm", "aten::linalg_norm")
def matrix_norm_flops(op: OpRecord) -> int:
    """The spectral and nuclear norms take the singular values; other norms are sums (not counted)."""
    shape = _matrix(op)
    order = op.arg("ord")
    dims = op.arg("dim")
    if isinstance(dims, int):
        dims = [dims]
    is_matrix_norm = op.kind == "aten::linalg_matrix_norm" or (dims is not None and len(dims) == 2) or (dims is None and order is not None and len(shape) == 2)
    if not is_matrix_norm or order not in _SPECTRAL_ORDERS:
        return 0
    if dims is not None:
        rows, columns = (shape[d] for d in dims[-2:])
        shape = (prod(shape) // (rows * columns), rows, columns)
    return round(svd_macs(shape, False, False))


@FLOP_FORMULAS.register("aten::linalg_cond")
def cond_flops(op: OpRecord) -> int:
    """2-norm condition numbers take the singular values; the others invert the matrix (the
    nuclear one also takes the singular values of both)."""
    shape = _matrix(op)
    order = op.arg_or("p", None)
    if order in (None, 2, -2):
        return round(svd_macs(shape, False, False))
    spectral = 2 * svd_macs(shape, False, False) if order == "nuc" else 0
    return round(inverse_macs(shape) + spectral)


@FLOP_FORMULAS.register("aten::linalg_matrix_sqrth")
def matrix_sqrth_flops(op: OpRecord) -> int:
    """The square root of a hermitian matrix: its eigen-decomposition, then ``V sqrt(L) V^H``."""
    shape = _matrix(op)
    batch, n, _ = _batch_m_n(shape)
    return round(eigh_macs(shape, True) + batch * n**3)


@FLOP_FORMULAS.register("aten::linalg_polar")
def polar_flops(op: OpRecord) -> int:
    """The polar decomposition ``A = U H`` from a thin SVD ``W S V^H``: ``U = W V^H`` and ``H = V S V^H``."""
    shape = op.shape("A")
    batch, m, n = _batch_m_n(shape)
    k = min(m, n)
    return round(svd_macs(shape, True, False) + batch * (m * k * n + n * k * n))


@FLOP_FORMULAS.register("aten::linalg_matrix_exp", "aten::matrix_exp")
def matrix_exp_flops(op: OpRecord) -> int:
    batch, n, _ = _batch_m_n(_matrix(op))
    return 5 * batch * n**3
