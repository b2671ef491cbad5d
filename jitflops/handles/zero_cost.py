"""Ops that cost no flops under jitflops' convention.

Shape and view changes, data movement and copies, indexing and gathering, tensor creation and
random sampling, dtype and device casts, sorting, selection and counting (medians, quantiles,
histograms), dropout and embedding lookups move or select data but do no arithmetic.
They are known ops: never reported as unsupported, always counted as zero. ``prim::`` graph
bookkeeping (constants, list and tuple construction) is skipped by the engine without listing here.
"""

from __future__ import annotations


def aten_kinds(names: str) -> frozenset[str]:
    """``"view cat"`` -> ``{"aten::view", "aten::cat"}``."""
    return frozenset(f"aten::{name}" for name in names.split())


ZERO_COST_OPS: frozenset[str] = aten_kinds(
    # scalars and sizes
    "Int Float Bool ScalarImplicit size numel dim item _local_scalar_dense "
    # views and shape changes
    "view view_as reshape reshape_as _reshape_alias flatten unflatten squeeze squeeze_ unsqueeze unsqueeze_ "
    "permute transpose transpose_ t t_ numpy_T mT mH adjoint matrix_H contiguous expand expand_as alias as_strided diagonal unfold "
    "movedim moveaxis swapaxes swapdims view_as_real view_as_complex resolve_conj resolve_neg "
    "pixel_shuffle pixel_unshuffle channel_shuffle broadcast_to broadcast_tensors meshgrid atleast_1d "
    "atleast_2d atleast_3d ravel real imag positive conj _conj _neg_view rot90 column_stack dstack hsplit vsplit dsplit "
    "linalg_diagonal diag diag_embed diagflat block_diag cartesian_prod combinations complex chalf im2col "
    "fft_fftshift fft_ifftshift lu_unpack "
    # splitting, joining, copying
    "narrow select slice split split_with_sizes unsafe_split chunk unsafe_chunk tensor_split unbind "
    "stack cat concat concatenate hstack vstack repeat repeat_interleave tile roll flip fliplr flipud "
    "clone copy_ detach detach_ lift_fresh fill_ zero_ pad constant_pad_nd reflection_pad1d reflection_pad2d "
    "reflection_pad3d replication_pad1d replication_pad2d replication_pad3d triu tril triu_ tril_ "
    # indexing
    "index index_select index_put index_put_ gather scatter scatter_ masked_scatter masked_select take "
    "nonzero embedding embedding_renorm_ one_hot take_along_dim argwhere nonzero_numpy nonzero_static index_copy index_copy_ "
    "index_fill index_fill_ put put_ max_unpool2d max_unpool3d _unsafe_masked_index "
    # creation
    "zeros zeros_like ones ones_like empty empty_like full full_like new_zeros new_ones new_empty new_full "
    "new_tensor arange linspace logspace eye tensor scalar_tensor rand rand_like randn randn_like randint "
    "randint_like randperm bernoulli bernoulli_ normal_ uniform_ normal cauchy_ exponential_ geometric_ log_normal_ random_ "
    "multinomial poisson empty_permuted fill "
    # casts and devices
    "to type_as contiguous_ requires_grad_ float double half bfloat16 int long bool cpu cuda "
    # ordering and selection without arithmetic
    "sort argsort msort topk kthvalue median nanmedian mode quantile nanquantile unique unique_consecutive unique_dim _unique2 "
    "searchsorted bucketize histc histogram histogramdd _histogramdd_bin_edges _histogramdd_from_bin_cts "
    "_histogramdd_from_bin_tensors "
    # regularisation that is an identity at inference
    "dropout dropout_ feature_dropout feature_dropout_ alpha_dropout alpha_dropout_ "
    "feature_alpha_dropout native_dropout "
    # what the dispatch front end sees of the same, below autograd, and their backward forms
    "_unsafe_view _to_copy _copy_from _copy_from_and_resize empty_strided new_empty_strided lift_fresh_copy "
    "alias_copy view_copy expand_copy permute_copy t_copy transpose_copy unsqueeze_copy squeeze_copy "
    "slice_copy select_copy split_copy unbind_copy _unsafe_index _unsafe_index_put _index_put_impl_ "
    "slice_backward select_backward index_select_backward embedding_dense_backward embedding_backward "
    "masked_fill_backward _unsafe_split as_strided_ as_strided_scatter slice_scatter select_scatter "
    "diagonal_backward diagonal_scatter _reshape_copy sym_size sym_numel sym_stride is_same_size "
    "_has_compatible_shallow_copy_type set_ resize_ resize_as_ zero _chunk_cat _to_sparse to_sparse _linalg_check_errors "
    "as_strided_copy diagonal_copy narrow_copy split_with_sizes_copy unfold_copy masked_scatter_backward "
    "_efficientzerotensor _unique sparse_mask "
    # what torch.export's graphs check of their values (the export front end)
    "_assert_tensor_metadata _assert_scalar sym_constrain_range_for_size _assert_async sym_storage_offset"
) | frozenset({
    # torch.profiler's record_function ranges (FSDP2 and DTensor mark their steps with them)
    "profiler::_record_function_enter", "profiler::_record_function_enter_new", "profiler::_record_function_exit",
    # FSDP2's copies into and out of its all-gather buffers, and DTensor's hand-over of a collective's result
    "fsdp::all_gather_copy_in", "fsdp::split_with_sizes_copy", "fsdp::chunk_cat",
    "_c10d_functional::_wrap_tensor_autograd", "_c10d_functional::wait_tensor",
    # quantized models' casts between float and integer tensors (their products: handles/integer.py)
    "aten::quantize_per_tensor", "aten::quantize_per_channel", "aten::quantize_per_tensor_dynamic", "aten::dequantize",
    "aten::q_scale", "aten::q_zero_point", "aten::int_repr", "aten::_make_per_tensor_quantized_tensor",
    # torchao's (its quantized tensors' dequantize to float and quantize on the fly)
    "torchao::dequantize_affine", "torchao::quantize_affine", "torchao::choose_qparams_affine",
})
