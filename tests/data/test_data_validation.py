"""validate(): one test per error, each asserting that the message names the fix; and the warnings."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch_geometric.data import Data

from gnnpipe.data import DataWarning, prepare, validate
from gnnpipe.errors import DataValidationError


def good(n: int = 6) -> Data:
    ei = torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]])
    y = torch.tensor([0, 1, 0, 1, 2, 2])[:n]
    tr = torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.bool)
    va = torch.tensor([0, 0, 0, 1, 0, 0], dtype=torch.bool)
    te = torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool)
    return Data(x=torch.randn(n, 3), edge_index=ei, y=y, train_mask=tr, val_mask=va, test_mask=te)


def fails(d, *needles: str) -> str:
    with pytest.raises(DataValidationError) as ei:
        validate(d)
    msg = str(ei.value)
    for s in needles:
        assert s in msg, f"{s!r} not in {msg!r}"
    return msg


def test_clean_graph_has_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate(good()) == []


def test_error_is_value_error_too():
    d = good()
    del d.x
    with pytest.raises(ValueError):
        validate(d)


# ---- edge_index
def test_edge_index_missing():
    d = good()
    del d.edge_index
    fails(d, "edge_index is missing", "torch.empty(2, 0")


def test_edge_index_wrong_shape():
    d = good()
    d.edge_index = torch.zeros(3, 4, dtype=torch.long)
    fails(d, "[2, E]", "[3, 4]")


def test_edge_index_transposed():
    d = good()
    d.edge_index = d.edge_index.t().contiguous()
    fails(d, "[2, E]", "edge_index.t()")


def test_edge_index_float_dtype():
    d = good()
    d.edge_index = d.edge_index.float()
    fails(d, "torch.float32", ".long()")


def test_edge_index_negative():
    d = good()
    d.edge_index[0, 2] = -1
    fails(d, "negative", "1 edge(s)", "[0, N)")


def test_edge_index_out_of_range():
    d = good()
    d.edge_index[1, 3] = 9
    fails(d, "vertex 9", "N = 6", "relabel")


def test_edge_index_sparse():
    d = good()
    d.edge_index = torch.sparse_coo_tensor(d.edge_index, torch.ones(6), (6, 6))
    fails(d, "sparse", ".indices()")


# ---- x
def test_x_missing():
    d = good()
    del d.x
    fails(d, "data.x", "torch.ones(N, 1)")


def test_x_not_2d():
    d = good()
    d.x = torch.randn(6)
    fails(d, "2-D", "unsqueeze(1)")


def test_x_nan_counts_rows():
    d = good()
    d.x[1, 0] = float("nan")
    d.x[4, 2] = float("nan")
    d.x[4, 1] = float("inf")
    fails(d, "2 of 6 row(s)", "NaN: 2", "inf: 1", "nan_to_num")


def test_x_inf_in_sparse_x():
    d = good()
    x = d.x.clone()
    x[3, 1] = float("-inf")
    d.x = x.to_sparse()
    fails(d, "1 of 6 row(s)", "nan_to_num")


# ---- y
def test_y_missing():
    d = good()
    del d.y
    fails(d, "data.y", "LongTensor[N]")


def test_y_wrong_length():
    d = good()
    d.y = d.y[:4]
    fails(d, "4 labels", "N = 6", "-1")


def test_y_multilabel():
    d = good()
    d.y = torch.nn.functional.one_hot(d.y, 3)
    fails(d, "1-D", "argmax(1)")


def test_y_non_integral_float():
    d = good()
    d.y = d.y.float() + 0.5
    fails(d, "non-integral", ".long()")


def test_negative_label_among_masked():
    d = good()
    d.y[1] = -1  # vertex 1 is in train_mask
    fails(d, "train_mask", "negative label", "data.train_mask &= data.y >= 0")


def test_negative_label_outside_masks_is_fine():
    d = good()
    d.val_mask[3] = False
    d.y[3] = -1  # in no mask any more
    assert validate(d) == []


def test_label_out_of_range_with_num_classes():
    d = good()
    fails_msg = None
    with pytest.raises(DataValidationError) as ei:
        validate(d, num_classes=2)
    fails_msg = str(ei.value)
    assert "test_mask" in fails_msg and "num_classes = 2" in fails_msg and "[0, 2)" in fails_msg
    d.num_classes = 2  # stored attribute is used as well
    with pytest.raises(DataValidationError, match="num_classes = 2"):
        validate(d)


# ---- masks
def test_train_mask_missing():
    d = good()
    del d.train_mask
    fails(d, "train_mask is missing", "random_split")


def test_train_mask_empty():
    d = good()
    d.train_mask[:] = False
    fails(d, "selects no vertex", "random_split")


def test_mask_wrong_length():
    d = good()
    d.val_mask = d.val_mask[:5]
    fails(d, "val_mask", "length N = 6", "[5]")


def test_mask_given_as_index_list():
    d = good()
    d.train_mask = torch.tensor([0, 1, 2])
    fails(d, "index_to_mask")


def test_mask_float_dtype():
    d = good()
    d.test_mask = d.test_mask.float()
    fails(d, "torch.float32", "> 0.5")


def test_mask_integer_not_01():
    d = good()
    d.train_mask = torch.tensor([0, 2, 0, 0, 0, 0])
    fails(d, "other than 0/1", "!= 0")


def test_mask_split_matrix_needs_column():
    d = good()
    d.train_mask = torch.stack([d.train_mask, d.train_mask], 1)
    fails(d, "2 predefined splits", "prepare(data, split=i)")
    assert prepare(d, split=1).train_mask.shape == (6,)


def test_integer_01_masks_are_accepted_and_converted():
    d = good()
    d.train_mask = d.train_mask.to(torch.uint8)
    d.val_mask = d.val_mask.long()
    assert validate(d) == []
    p = prepare(d)
    assert p.train_mask.dtype == torch.bool and p.val_mask.dtype == torch.bool


# ---- warnings
def test_no_edges_warns():
    d = good()
    d.edge_index = torch.empty(2, 0, dtype=torch.long)
    with pytest.warns(DataWarning, match="no edges"):
        found = validate(d)
    assert len(found) == 1


def test_isolated_vertices_are_silent():
    d = good()
    d.x = torch.randn(6, 3)
    d.edge_index = torch.tensor([[0], [1]])  # vertices 2..5 isolated
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert validate(d) == []


def test_missing_eval_masks_and_overlap_warn():
    d = good()
    del d.val_mask
    d.test_mask[0] = True  # also a training vertex
    with pytest.warns(DataWarning) as rec:
        found = validate(d)
    assert len(found) == 2 and len(rec) == 2
    assert any("val_mask is missing" in m for m in found)
    assert any("both train_mask and test_mask" in m for m in found)


# --- values judged in the dtype training uses -------------------------------------------------------------------

def _graph64(big: float = 1e300):
    from gnnpipe.data import synthetic_graph

    d = synthetic_graph(num_nodes=60, avg_degree=5.0, num_classes=3, num_features=6, train_per_class=5,
                        val_per_class=5, seed=1)
    d.x = d.x.double()
    d.x[3, 2] = big
    return d


def test_float64_beyond_float32_is_refused_in_float32():
    from gnnpipe.data import check_finite_in_dtype, prepare
    from gnnpipe.errors import DataValidationError

    d = _graph64()
    with pytest.raises(DataValidationError,
                       match=r"data\.x has 1 value.*float64.*float32.*1e\+300.*scale.*--dtype float64"):
        prepare(d)
    with pytest.raises(DataValidationError, match="float32"):
        check_finite_in_dtype(d.x, "data.x", torch.float32)
    check_finite_in_dtype(d.x, "data.x", torch.float64)  # representable there: no error
    out = prepare(d, dtype=torch.float64)
    assert out.x.dtype == torch.float64 and float(out.x.max()) == 1e300  # the float64 run keeps the value


def test_float32_max_is_not_an_overflow():
    from gnnpipe.data import prepare

    d = _graph64(big=float(torch.finfo(torch.float32).max))  # exactly representable
    assert torch.isfinite(prepare(d).x).all()


def test_check_finite_in_dtype_names_the_tensor_for_any_attribute():
    from gnnpipe.data import check_finite_in_dtype
    from gnnpipe.errors import DataValidationError

    pos = torch.zeros(4, 3, dtype=torch.float64)
    pos[1, 0] = -1e40
    with pytest.raises(DataValidationError, match=r"data\.pos has 1 value.*largest magnitude 1e\+40"):
        check_finite_in_dtype(pos, "data.pos", torch.float32)
    with pytest.raises(DataValidationError, match=r"data\.energy has non-finite values \(NaN: 1"):
        check_finite_in_dtype(torch.tensor([1.0, float("nan")]), "data.energy", torch.float64)
    check_finite_in_dtype(torch.tensor([2**62]), "data.z", torch.float32)  # integers: always finite in a float


def test_edge_weight_is_checked():
    from gnnpipe.data import prepare
    from gnnpipe.errors import DataValidationError

    d = _graph64(big=1.0)
    e = d.edge_index.size(1)
    d.edge_weight = torch.ones(e, dtype=torch.float64)
    d.edge_weight[0] = 1e39
    with pytest.raises(DataValidationError, match=r"data\.edge_weight has 1 value.*float32"):
        prepare(d)
    assert prepare(d, dtype=torch.float64).edge_weight.dtype == torch.float64
    d.edge_weight = torch.ones(e - 1)
    with pytest.raises(DataValidationError, match=r"data\.edge_weight must hold one weight per edge"):
        prepare(d)
    d.edge_weight = torch.ones(e)
    d.edge_weight[5] = float("inf")
    with pytest.raises(DataValidationError, match=r"data\.edge_weight has non-finite values \(NaN: 0, inf: 1"):
        prepare(d)
