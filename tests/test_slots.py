"""The slot layout of docs/design.md section 2: where each real token sits in a constant matrix."""

from __future__ import annotations

import pytest
import torch

from papa_surgery.calibration.accumulate import SlotLayout
from papa_surgery.hub_code.slots import PAD_SLOT, compute_slots, constant_probs
from papa_surgery.hub_code.slots import reference_constant_attention as constant_attention

L = 16
SEP, PAD, CLS = 3, 0, 2


def ids_and_mask(rows: list[list[int]], side: str = "right"):
    """Pad rows of ids (PAD) to one length; (B, N) ids and mask."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), PAD)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for b, r in enumerate(rows):
        sl = slice(0, len(r)) if side == "right" else slice(n - len(r), n)
        ids[b, sl] = torch.tensor(r)
        mask[b, sl] = 1
    return ids, mask


def real_slots(slots: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    return [s[m.bool()].tolist() for s, m in zip(slots, mask, strict=True)]


def test_single_sentence():
    ids, mask = ids_and_mask([[CLS, 10, 11, 12, SEP], [CLS, 10, SEP]])
    slots = compute_slots(ids, mask, L, SEP)
    assert slots.dtype == torch.long and slots.shape == ids.shape
    assert slots[0].tolist() == [0, 1, 2, 3, L - 1]
    assert slots[1].tolist() == [0, 1, L - 1, PAD_SLOT, PAD_SLOT]


def test_pair_single_separator():
    # [CLS] a b [SEP] c d e [SEP]: the middle separator at L/2, the second segment after it, the last at L-1.
    ids, mask = ids_and_mask([[CLS, 10, 11, SEP, 12, 13, 14, SEP]])
    assert compute_slots(ids, mask, L, SEP)[0].tolist() == [0, 1, 2, 8, 9, 10, 11, L - 1]


def test_pair_roberta_double_separator():
    # <s> a b </s></s> c </s>: the two middle separators at L/2 and L/2 + 1.
    ids, mask = ids_and_mask([[CLS, 10, 11, SEP, SEP, 12, SEP]])
    assert compute_slots(ids, mask, L, SEP)[0].tolist() == [0, 1, 2, 8, 9, 10, L - 1]


def test_pair_detection_needs_the_separator_id():
    ids, mask = ids_and_mask([[CLS, 10, SEP, 12, SEP]])
    assert compute_slots(ids, mask, L, None)[0].tolist() == [0, 1, 2, 3, L - 1]


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_side_does_not_change_real_slots(side):
    rows = [[CLS, 10, 11, SEP, 12, SEP], [CLS, 10, SEP], [CLS, 10, 11, 12, 13, 14, 15, SEP]]
    ids, mask = ids_and_mask(rows, side)
    slots = compute_slots(ids, mask, L, SEP)
    assert real_slots(slots, mask) == [[0, 1, 2, 8, 9, L - 1], [0, 1, L - 1], [0, 1, 2, 3, 4, 5, 6, L - 1]]
    assert (slots[~mask.bool()] == PAD_SLOT).all()
    if side == "left":
        assert slots[1, :5].tolist() == [PAD_SLOT] * 5


def test_mixed_singles_and_pairs_in_one_batch():
    ids, mask = ids_and_mask([[CLS, 10, SEP], [CLS, 10, SEP, 11, SEP]])
    assert real_slots(compute_slots(ids, mask, L, SEP), mask) == [[0, 1, L - 1], [0, 1, 8, 9, L - 1]]


def test_no_ids_inputs_embeds():
    # Called with inputs_embeds: no ids, so every input is one segment.
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    assert compute_slots(None, mask, L).tolist() == [[0, 1, L - 1, PAD_SLOT], [0, 1, 2, L - 1]]
    slots = compute_slots(None, None, L, SEP, shape=(2, 3), device=torch.device("cpu"))
    assert slots.tolist() == [[0, 1, L - 1]] * 2


def test_no_mask_means_no_padding():
    ids = torch.tensor([[CLS, 10, SEP, 11, SEP]])
    assert compute_slots(ids, None, L, SEP).tolist() == [[0, 1, 8, 9, L - 1]]


def test_exact_fits():
    # L tokens fill every slot; each pair half filled exactly.
    single = [CLS] + [10] * (L - 2) + [SEP]
    assert compute_slots(*ids_and_mask([single]), L, SEP)[0].tolist() == list(range(L))
    half = L // 2
    pair = [CLS] + [10] * (half - 1) + [SEP] + [11] * (L - 2 - half) + [SEP]
    assert compute_slots(*ids_and_mask([pair]), L, SEP)[0].tolist() == list(range(L))


def test_input_longer_than_max_length():
    ids, mask = ids_and_mask([[CLS] + [10] * L + [SEP], [CLS, SEP]])
    with pytest.raises(ValueError, match=rf"{L + 2} tokens.*papa_max_length={L}"):
        compute_slots(ids, mask, L, SEP)
    with pytest.raises(ValueError, match=rf"max_length={L}"):
        compute_slots(None, mask, L)


def test_a_first_segment_longer_than_its_half_moves_the_middle_just_enough():
    # Issue 23: any input of at most L tokens has a place. The middle separator moves to the first segment's end.
    half = L // 2
    first = [CLS] + [10] * half  # half + 1 tokens before the middle separator
    ids, mask = ids_and_mask([first + [SEP, 11, SEP]])
    slots = compute_slots(ids, mask, L, SEP)[0].tolist()
    assert slots == list(range(half + 1)) + [half + 1, half + 2, L - 1]
    full = first + [SEP] + [11] * (L - len(first) - 2) + [SEP]  # exactly L tokens: every slot used
    assert compute_slots(*ids_and_mask([full]), L, SEP)[0].tolist() == list(range(L))


def test_a_second_segment_longer_than_its_half_moves_the_middle_just_enough():
    half = L // 2
    limit = L - 1 - half  # slots between the middle separator and the final one
    ids, mask = ids_and_mask([[CLS, 10, SEP, SEP] + [11] * (limit - 1) + [SEP]])  # limit + 1 after the middle
    slots = compute_slots(ids, mask, L, SEP)[0].tolist()
    middle = L - 1 - (limit + 1)
    assert slots == [0, 1] + list(range(middle, L - 1)) + [L - 1] and middle == half - 1
    ok_ids, ok_mask = ids_and_mask([[CLS, 10, SEP, SEP] + [11] * (limit - 2) + [SEP]])  # fits: the paper's layout
    assert compute_slots(ok_ids, ok_mask, L, SEP)[0].tolist() == [0, 1] + list(range(half, L - 1)) + [L - 1]


def test_constant_probs_and_attention():
    ids, mask = ids_and_mask([[CLS, 10, SEP, 11, SEP], [CLS, 10, 11, SEP], [CLS, 10, SEP, 11, SEP]])
    slots = compute_slots(ids, mask, L, SEP)
    c = torch.rand(3, L, L) + 0.1
    probs = constant_probs(c, slots, torch.float32)  # (B, Hc, N, N)
    assert probs.shape == (3, 3, ids.shape[1], ids.shape[1])
    for b in range(3):
        real = mask[b].bool()
        s = slots[b][real]
        expected = c[:, s][:, :, s]
        expected = expected / expected.sum(-1, keepdim=True)
        got = probs[b][:, real][:, :, real]
        assert torch.allclose(got, expected, atol=1e-6)
        assert probs[b][:, :, ~real].abs().sum() == 0
        assert probs[b][:, ~real].abs().sum() == 0  # padding queries get no mass
    value = torch.randn(3, 3, ids.shape[1], 4)  # (B, Hc, N, d)
    out, used = constant_attention(c, slots, value)
    assert torch.equal(used, probs)
    assert torch.allclose(out, probs @ value, atol=1e-6)


def test_constant_probs_follow_each_example_whatever_the_order():
    # Different layouts in a batch, left padded: each example reads its own cells.
    ids, mask = ids_and_mask([[CLS, 10, 11, SEP], [CLS, SEP], [CLS, 10, SEP]], side="left")
    slots = compute_slots(ids, mask, L, SEP)
    value = torch.randn(3, 1, ids.shape[1], 2)
    out, _ = constant_attention(torch.eye(L).expand(1, L, L), slots, value)
    real = mask.bool()
    assert torch.allclose(out[:, 0][real], value[:, 0][real])


def test_slot_layout_groups_equal_layouts():
    # The accumulator's grouping (calibration on CUDA): equal slot rows share one layout.
    ids, mask = ids_and_mask([[CLS, 10, SEP], [CLS, 11, SEP], [CLS, 10, 11, SEP]])
    layout = SlotLayout(compute_slots(ids, mask, L, SEP), L)
    assert layout.unique.shape[0] == 2
    assert layout.inverse[0] == layout.inverse[1] != layout.inverse[2]
    assert torch.equal(layout.unique[layout.inverse], layout.slots)


def test_zero_rows_give_zero():
    ids, mask = ids_and_mask([[CLS, 10, SEP]])
    c = torch.ones(1, L, L)
    c[0, 1] = 0  # slot 1 never seen
    probs = constant_probs(c, compute_slots(ids, mask, L, SEP), torch.float32)
    assert probs[0, 0, 1].abs().sum() == 0
    assert torch.allclose(probs[0, 0, [0, 2]].sum(-1), torch.ones(2))


def test_a_pair_as_inputs_embeds_is_not_silently_one_segment(papa_model):
    import torch

    model, tokenizer = papa_model
    enc = tokenizer("the cat sat", "a dog ran", return_tensors="pt")
    with torch.no_grad():
        by_ids = model(**enc).last_hidden_state
        embeds = model.get_input_embeddings()(enc["input_ids"])
        try:
            by_embeds = model(
                inputs_embeds=embeds, attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"]
            ).last_hidden_state
        except ValueError as err:
            assert "inputs_embeds" in str(err)
            return
    torch.testing.assert_close(by_embeds, by_ids)
