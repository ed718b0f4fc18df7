"""Pruned draft vocabularies without an engine: the ranking, the file and every
refusal, the options, and the sliced LM head against the full one."""

import pytest
import torch
from torch import nn

from vllm_layerskip.core.draft_head import DraftHead
from vllm_layerskip.core.draft_vocab import DRAFT_VOCAB, DraftVocab, draft_token_ids, load_draft_vocab, save_draft_vocab
from vllm_layerskip.core.errors import LayerSkipConfigError
from vllm_layerskip.core.identity import ModelIdentity
from vllm_layerskip.methods.layer_skip.options import LayerSkipOptions
from vllm_layerskip.tools.draft_vocab import rank, special_and_template_ids

MODEL = ModelIdentity("/m/Tiny", "LlamaForCausalLM", 4, 8, 20, fingerprint="00ff00ff00ff00ff")


def test_ranking_puts_special_tokens_first_then_counts_then_id_order():
    from collections import Counter

    ranking = rank(Counter({7: 5, 3: 5, 11: 9, 2: 1, 99: 4}), first=[19, 0], vocab_size=20)
    assert ranking.tolist()[:6] == [19, 0, 11, 3, 7, 2]  # ties by id; 99 is outside the vocabulary
    assert sorted(ranking.tolist()) == list(range(20))  # every id once
    assert ranking.tolist()[6:] == [i for i in range(20) if i not in (19, 0, 11, 3, 7, 2)]


def test_special_and_chat_template_tokens_are_kept(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    ids = special_and_template_ids(tok)
    for marker in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tok.convert_tokens_to_ids(marker) in ids
    for word in ("system", "user", "assistant", "\n"):  # what the template writes around messages
        assert set(tok.encode(word, add_special_tokens=False)) <= set(ids), word
    assert tok.encode("x", add_special_tokens=False)[0] not in ids  # a message's content is not


def _write(path, ids, model=MODEL, size=None, always=2):
    source = {} if size is None else {"size": size}
    save_draft_vocab(path, DraftVocab(model=model, token_ids=torch.tensor(ids), always_included=always,
                                      source=source))
    return str(path)


def test_file_round_trip_and_sizes(tmp_path):
    path = _write(tmp_path / "v.draft-vocab.safetensors", list(range(19, -1, -1)), size=6)
    assert load_draft_vocab(path, MODEL).token_ids.tolist() == list(range(19, -1, -1))
    assert draft_token_ids(path, 0, MODEL).tolist() == [19, 18, 17, 16, 15, 14]  # the file's size
    assert draft_token_ids(path, 3, MODEL).tolist() == [19, 18, 17]
    with pytest.raises(LayerSkipConfigError, match=r"'draft_vocab_size' 21 is larger than the model's vocabulary \(20 tokens\)"):
        draft_token_ids(path, 21, MODEL)
    with pytest.raises(LayerSkipConfigError, match=r"'draft_vocab_size' 1 would leave out some of the 2 special"):
        draft_token_ids(path, 1, MODEL)
    short = _write(tmp_path / "short.draft-vocab.safetensors", [3, 4, 5])
    with pytest.raises(LayerSkipConfigError, match=r"larger than the 3 token ids that draft vocabulary '.*short.draft-vocab.safetensors' ranks"):
        draft_token_ids(short, 4, MODEL)


def test_refusals(tmp_path):
    def refused(path, message):
        with pytest.raises(LayerSkipConfigError, match=message):
            load_draft_vocab(str(path), MODEL)

    hint = r"Make one for this model with `vllm-layerskip draft-vocab --model MODEL"
    refused(tmp_path / "none.safetensors", "does not exist. " + hint)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00junk" * 9)
    refused(tmp_path / "junk.safetensors", "is not a readable safetensors file")
    other = ModelIdentity("/m/Tiny", "LlamaForCausalLM", 4, 8, 20, fingerprint="1234123412341234")
    refused(_write(tmp_path / "o.safetensors", [1, 2], model=other),
            r"was made for another model \(weights: file 1234123412341234 vs running 00ff00ff00ff00ff")
    refused(_write(tmp_path / "big.safetensors", [1, 25]), r"token ids \[25\] outside the vocabulary 0..19")
    refused(_write(tmp_path / "dup.safetensors", [1, 2, 1]), "a token id is ranked twice")
    with pytest.raises(LayerSkipConfigError, match=r"No shipped draft vocabulary for model 'Tiny' \(shipped for: .*\)\. Make one"):
        DRAFT_VOCAB.resolve("shipped", MODEL)


def test_options_default_to_the_shipped_file_and_check_the_model(tmp_path, smollm2_path):
    from vllm_layerskip.core.identity import checkpoint_identity

    # Unset: the vocabulary shipped for the model, if any; 0: the whole one.
    assert LayerSkipOptions().draft_token_ids(MODEL) is None  # none shipped for it
    smollm2 = checkpoint_identity(smollm2_path)
    shipped = LayerSkipOptions().draft_token_ids(smollm2)
    assert shipped is not None and len(shipped) == 16384
    assert LayerSkipOptions(draft_vocab_size=0).draft_token_ids(smollm2) is None
    assert len(LayerSkipOptions(draft_vocab_size=4096).draft_token_ids(smollm2)) == 4096
    with pytest.raises(LayerSkipConfigError, match="No shipped draft vocabulary for model 'Tiny'"):
        LayerSkipOptions(draft_vocab_size=64).draft_token_ids(MODEL)
    with pytest.raises(LayerSkipConfigError, match=r"'draft_vocab_size' must be an integer >= 0 \(token ids\), got -1"):
        LayerSkipOptions(draft_vocab_size=-1)
    with pytest.raises(LayerSkipConfigError, match="'draft_vocab' must be \"shipped\" or the path"):
        LayerSkipOptions(draft_vocab=3)
    path = _write(tmp_path / "v.safetensors", list(range(20)), size=4)
    options = LayerSkipOptions(skip_layers=[1], draft_vocab=path, draft_vocab_size=30)
    with pytest.raises(LayerSkipConfigError, match="larger than the model's vocabulary"):
        options.validate_for_model(MODEL)  # every method's validation checks the vocabulary


class _Processor(nn.Module):
    scale, soft_cap = 1.0, None


class _Model(nn.Module):
    """What DraftHead reads of a vLLM model: lm_head.weight, logits_processor,
    compute_logits."""

    def __init__(self, vocab=50, hidden=16):
        super().__init__()
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.logits_processor = _Processor()

    def compute_logits(self, hidden):
        return self.lm_head(hidden)


def _stack(model: _Model, draft_weights: str | None = None):
    """What DraftHead reads of the decoder stack: the model, its full logits and
    whether it has draft weights (`draft`: the layers' copies, None without)."""
    draft = None if draft_weights is None else [draft_weights]
    return type("Stack", (), {"model": model, "logits": lambda self, h: model.compute_logits(h),
                              "draft": draft})()


def test_sliced_head_scores_exactly_the_chosen_rows():
    torch.manual_seed(0)
    model = _Model()
    stack = _stack(model)
    ids = torch.tensor([7, 3, 42, 0, 19])
    hidden = torch.randn(4, 16)
    full, pruned = DraftHead(stack), DraftHead(stack, ids)
    torch.testing.assert_close(pruned.logits(hidden), full.logits(hidden)[:, ids])
    best = pruned.logits(hidden).argmax(-1)
    assert pruned.to_token_ids(best).tolist() == ids[best].tolist()
    q = torch.softmax(pruned.logits(hidden), -1)
    row = torch.full((4, 50), 9.0)
    pruned.scatter(q, row)
    assert torch.equal(row[:, ids], q) and row.sum(-1).allclose(torch.ones(4))
    assert (row[:, [i for i in range(50) if i not in ids.tolist()]] == 0).all()
    assert pruned.num_columns(50) == 5 and full.num_columns(50) == 50


@pytest.mark.parametrize("scheme", ["int4", "w8a8"])
def test_with_draft_weights_the_slice_is_read_at_4_bits_and_its_best_columns_exactly(scheme):
    """With draft weights (any scheme) a pruned head reads a 4-bit copy of its
    rows for passes of up to 4 tokens and scores the copy's best columns again
    with the model's rows: those logits are exact, and so is the choice among
    them; larger passes (and the full head) read the model's rows."""
    from vllm_layerskip.core.draft_head import RESCORED

    torch.manual_seed(0)
    model = _Model(vocab=400, hidden=64).to(torch.bfloat16)
    ids = torch.randperm(400)[:160]  # a multiple of 16 rows: int4's kernel tiles
    plain, copied = DraftHead(_stack(model), ids), DraftHead(_stack(model, scheme), ids)
    assert plain.quantized_bytes == 0 and copied._slice.quantized.scheme == "int4"
    assert copied._slice.max_quantized_tokens == 4
    assert 0 < copied.quantized_bytes < 160 * 64 * 2 // 2  # under half the bf16 rows' bytes
    hidden = torch.randn(4, 64, dtype=torch.bfloat16)
    want, got = plain.logits(hidden), copied.logits(hidden)
    assert not torch.equal(got, want)  # the other columns are the copy's
    approx = copied._slice.quantized.matmul(hidden).float()
    top = approx.topk(RESCORED, dim=-1).indices
    torch.testing.assert_close(got.gather(-1, top), want.gather(-1, top), rtol=1e-2, atol=1e-2)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    many = torch.randn(5, 64, dtype=torch.bfloat16)
    assert torch.equal(copied.logits(many), plain.logits(many))
    assert DraftHead(_stack(model, scheme))._slice is None  # the full head: the model's own


def test_the_id_table_is_copied_to_a_device_once():
    torch.manual_seed(0)
    model = _Model()
    stack = _stack(model)
    head = DraftHead(stack, torch.tensor([7, 3, 42, 0, 19], dtype=torch.int32))
    assert head.token_ids.dtype == torch.int64 and head.token_ids.device.type == "cpu"
    first = head._ids_on(torch.device("cpu"))
    head.to_token_ids(torch.tensor([1, 0]))
    head.scatter(torch.full((1, 5), 0.2), torch.zeros(1, 50))
    assert head._ids_on(torch.device("cpu")) is first and list(head._ids_on_device) == [torch.device("cpu")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI here has none)")
def test_sliced_head_on_a_gpu_matches_the_cpu_and_keeps_its_ids_there():
    """The draft head as a GPU engine runs it: weights, hidden states, sampled q
    rows and SWIFT's scored columns on the device; drafted columns on the host."""
    torch.manual_seed(0)
    cpu_model, gpu_model = _Model(vocab=1000, hidden=64), _Model(vocab=1000, hidden=64)
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model = gpu_model.cuda()
    ids = torch.randperm(1000)[:300]
    heads = {"cpu": DraftHead(_stack(cpu_model), ids), "cuda": DraftHead(_stack(gpu_model), ids)}
    assert heads["cuda"]._slice.weight.is_cuda
    hidden = torch.randn(6, 64)
    logits_cpu, logits_gpu = heads["cpu"].logits(hidden), heads["cuda"].logits(hidden.cuda())
    torch.testing.assert_close(logits_gpu.cpu(), logits_cpu, rtol=1e-4, atol=1e-4)
    columns = logits_gpu.argmax(-1)
    on_device = heads["cuda"].to_token_ids(columns)  # SWIFT's scoring: columns on the GPU
    on_host = heads["cuda"].to_token_ids(columns.cpu())  # drafting: columns back on the host
    assert on_device.is_cuda and not on_host.is_cuda
    assert on_device.cpu().tolist() == on_host.tolist() == ids[columns.cpu()].tolist()
    q = torch.softmax(logits_gpu, -1)
    row = torch.full((6, 1000), 9.0, device="cuda")
    heads["cuda"].scatter(q, row)
    assert torch.equal(row[:, ids.cuda()], q) and row.sum(-1).allclose(torch.ones(6, device="cuda"))
    table = heads["cuda"]._ids_on(torch.device("cuda", torch.cuda.current_device()))
    heads["cuda"].scatter(q, row)
    assert heads["cuda"]._ids_on(row.device) is table and table.is_cuda
