"""GGUF files (abspos_jax/interop/gguf.py): parity with transformers' own load, metadata -> config, bad files.

Every file is written here with gguf-py's ``GGUFWriter`` from a small random
transformers model, the way llama.cpp's converter writes one (Llama's q/k rows
permuted, tied embeddings as a missing ``output.weight``, a byte-level BPE
tokenizer). Nothing is downloaded.
"""

import json
import os
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import gguf
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from abspos_jax import variants
from abspos_jax.analysis import AnalysisOptions, analyze_hf
from abspos_jax.interop import gguf as gguf_lib
from abspos_jax.interop import hf
from abspos_jax.interop.hf.texts import _bytes_to_unicode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4
VOCAB = 320
FAST = AnalysisOptions(interventions=False, progress=False, batch_size=8)
Q = gguf.GGMLQuantizationType
# Byte offsets of the float16 scales in one block of each K-quant type (gguf.quants' block layouts).
K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_model(family: str = "llama", *, d_model: int = 64, std: float = 0.15, **fields):
  """A random float32 transformers model: GQA (4 query / 2 kv heads), tied embeddings unless told otherwise."""
  cfg_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[family]
  kw = dict(hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=True,
            rope_theta=5e4, rms_norm_eps=1e-5)
  torch.manual_seed(0)
  model = model_cls(cfg_cls(**{**kw, **fields})).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.add_(torch.randn_like(p) * std) if name.endswith("norm.weight") else p.normal_(0.0, std)
  return model


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's convert_hf_to_gguf ``permute`` of a Llama q/k projection (what the reader must undo)."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def k_quant_bytes(qtype, rows: int, cols: int, rng) -> np.ndarray:
  """Raw blocks of a K-quant type: random quants and sub-scales, small valid float16 scales."""
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
  for offset, value in zip(K_SCALES[qtype], (2e-3, 1e-3)):
    raw[:, :, offset:offset + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
  return raw.reshape(rows, -1)


def write_gguf(model, path, qtype=Q.F32, *, kquants: dict | None = None, name: str = "tiny", tokenizer: bool = True,
               extra=None, unsupported: str | None = None) -> None:
  """``model`` as llama.cpp writes it: 2-D weights in ``qtype`` (1-D ones F32), or the K-quant of ``kquants``
  (tensor-name substring -> type) filled with random blocks; ``extra(writer)`` adds metadata; ``unsupported``
  writes that tensor as random IQ4_NL blocks."""
  cfg = model.config
  arch = cfg.model_type
  w = gguf.GGUFWriter(str(path), arch)
  w.add_name(name)
  w.add_block_count(cfg.num_hidden_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
  w.add_vocab_size(cfg.vocab_size)
  w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == Q.F32 else gguf.LlamaFileType.MOSTLY_Q8_0)
  if tokenizer:
    tokens = [_bytes_to_unicode()[b] for b in range(256)] + ["<bos>", "<eos>", "<pad>", "Ġt"]
    tokens += [f"<unused{i}>" for i in range(cfg.vocab_size - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3] * 3 + [1] * (len(tokens) - 259))
    w.add_token_merges(["Ġ t"])  # one merge: " t" is one token
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_add_bos_token(True)
  if extra:
    extra(w)
  names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA if arch == "llama" else gguf.MODEL_ARCH.QWEN2,
                                   cfg.num_hidden_layers)
  rng = np.random.default_rng(1)
  for hf_name, p in model.state_dict().items():
    if cfg.tie_word_embeddings and hf_name == "lm_head.weight":
      continue
    base, suffix = hf_name.rsplit(".", 1)
    name_ = f"{names.get_name(base)}.{suffix}"
    x = p.float().numpy()
    kind = next((k for s, k in (kquants or {}).items() if s in hf_name), None)
    if unsupported and unsupported in hf_name:
      block, size = gguf.GGML_QUANT_SIZES[Q.IQ4_NL]
      w.add_tensor(name_, rng.integers(0, 256, (x.shape[0], x.shape[1] // block * size), dtype=np.uint8),
                   raw_dtype=Q.IQ4_NL)
      continue
    if kind is not None:  # random blocks; the reference reads the same bytes
      w.add_tensor(name_, k_quant_bytes(kind, *x.shape, rng), raw_dtype=kind)
      continue
    if arch == "llama" and suffix == "weight" and (".q_proj." in hf_name or ".k_proj." in hf_name):
      x = llama_cpp_permute(x, cfg.num_attention_heads if ".q_proj." in hf_name else cfg.num_key_value_heads)
    t = qtype if x.ndim == 2 else Q.F32
    w.add_tensor(name_, gguf.quants.quantize(x, t), raw_dtype=t)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def logits_both(path) -> tuple[np.ndarray, np.ndarray]:
  """Our logits and transformers' (its own GGUF load of the same file) on the same random tokens."""
  _, ours, _ = hf.load_hf(str(path), seq_len=24)
  ref = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
  x = np.random.default_rng(0).integers(0, VOCAB, (2, 24))
  with torch.no_grad():
    want = ref(torch.tensor(x)).logits.float().numpy()
  return np.asarray(ours(jnp.asarray(x)), np.float64), want.astype(np.float64)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_llama_gguf_matches_transformers(qtype, tmp_path):
  """GQA, tied embeddings, Llama's permuted q/k: float and block-quantised files."""
  path = tmp_path / f"tiny-{qtype}.gguf"
  write_gguf(random_model(), path, getattr(Q, qtype))
  ours, want = logits_both(path)
  diff = float(np.abs(ours - want).max())
  print(f"parity {qtype}: {diff:.2e} (logits up to {np.abs(want).max():.1f})")
  assert diff < TOL
  config, _, hf_config = hf.load_hf(str(path), seq_len=24)
  assert (config.model.num_kv_heads, config.model.tie_embeddings, config.model.rope_base) == (2, True, 5e4)
  assert hf_config["_name_or_path"] == "tiny"


def test_k_quants_match_transformers(tmp_path):
  """Q2_K ... Q6_K (256-element blocks), each on its own tensor kind."""
  path = tmp_path / "kq.gguf"
  kinds = {"q_proj": Q.Q2_K, "k_proj": Q.Q3_K, "v_proj": Q.Q4_K, "o_proj": Q.Q5_K, "gate_proj": Q.Q6_K}
  write_gguf(random_model(d_model=256, std=0.05), path, Q.F16, kquants=kinds)
  info = hf.Checkpoint(str(path)).describe()
  assert {k: info["tensor_types"][k] for k in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")} == dict.fromkeys(
      ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"), 2)
  ours, want = logits_both(path)
  assert np.abs(ours - want).max() < TOL


def test_qwen2_gguf_with_biases_and_an_output_matrix(tmp_path):
  path = tmp_path / "qwen.gguf"
  write_gguf(random_model("qwen2", tie_word_embeddings=False), path, Q.F32)
  ours, want = logits_both(path)
  assert np.abs(ours - want).max() < TOL
  config, _, _ = hf.load_hf(str(path), seq_len=24)
  assert config.model.qkv_bias and not config.model.tie_embeddings


def test_unpermute_inverts_llama_cpp():
  w = np.arange(8 * 2 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of 8 rows
  np.testing.assert_array_equal(gguf_lib.unpermute_qk(llama_cpp_permute(w, 2), 2), w)
  assert not np.array_equal(llama_cpp_permute(w, 2), w)


SMOL_META = {  # the metadata keys SmolLM2-135M's GGUF carries (tokenizer arrays as their lengths)
    "general.architecture": "llama", "general.name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "general.file_type": 3,
    "llama.block_count": 30, "llama.context_length": 8192, "llama.embedding_length": 576,
    "llama.feed_forward_length": 1536, "llama.attention.head_count": 9, "llama.attention.head_count_kv": 3,
    "llama.rope.freq_base": 100000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 49152,
    "llama.rope.dimension_count": 64, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": 49152,
    "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
    "tokenizer.ggml.padding_token_id": 2, "tokenizer.ggml.add_bos_token": False,
}


def test_config_from_gguf_metadata():
  cfg = gguf_lib.hf_config(SMOL_META, ["token_embd.weight"], where="smol.gguf")
  c = hf.config_from_hf(cfg, seq_len=128, where="smol.gguf")
  m = c.model
  assert (m.num_layers, m.d_model, m.num_heads, m.num_kv_heads, m.mlp_dim, m.vocab_size) == (30, 576, 9, 3, 1536,
                                                                                            49152)
  assert (m.rope_base, m.tie_embeddings, m.position, m.norm_eps) == (1e5, True, "rope", pytest.approx(1e-5))
  # an architecture key we do not map is refused under its own name, and can be dropped on purpose
  with pytest.raises(hf.HFConversionError, match=r"llama\.expert_count=8 is not supported"):
    hf.config_from_hf(gguf_lib.hf_config({**SMOL_META, "llama.expert_count": 8}, [], "x"), seq_len=8, where="x")
  moe = gguf_lib.hf_config({**SMOL_META, "llama.expert_count": 8}, [], "x")
  assert hf.config_from_hf(moe, seq_len=8, ignore=["llama.expert_count"]).model.num_layers == 30
  for meta, match in (({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0},
                       r"rope_scaling\.rope_type='linear' is not supported"),
                      ({"llama.rope.dimension_count": 32}, r"partial_rotary_factor=0\.5 is not supported"),
                      ({"llama.attention.sliding_window": 4096}, r"llama\.attention\.sliding_window=4096"),
                      ({"general.architecture": "gpt2"}, r"general\.architecture='gpt2'.*supported GGUF "
                                                         r"architectures: llama, qwen2"),
                      ({"split.count": 2}, r"split\.count=2 is not supported")):
    with pytest.raises(hf.HFConversionError, match=match):
      hf.config_from_hf(gguf_lib.hf_config({**SMOL_META, **meta}, [], "x"), seq_len=8, where="x")
  assert gguf_lib.hf_config({**SMOL_META, "llama.rope.scaling.type": "none"}, [], "x").get("rope_scaling") is None
  assert gguf_lib.hf_config({**SMOL_META, "general.name": "Mistral 7B"}, [], "x")["model_type"] == "mistral"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
  write_gguf(random_model(), path, Q.Q8_0)
  return path


def test_bad_files_are_refused_by_name_and_nothing_is_written(tiny_gguf, tmp_path):
  data = tiny_gguf.read_bytes()
  cases = {}
  (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
  cases["cut.gguf"] = r"truncated or corrupt"
  (tmp_path / "junk.gguf").write_bytes(b"GGML" + data[4:])
  cases["junk.gguf"] = r"not a GGUF file \(it does not start with the bytes 'GGUF'\)"
  write_gguf(random_model(), tmp_path / "iq.gguf", unsupported="mlp.up_proj")
  cases["iq.gguf"] = r"tensor blk\.0\.ffn_up\.weight='IQ4_NL' is not supported: supported tensor types: F32, .*Q6_K"
  write_gguf(random_model(), tmp_path / "notok.gguf", tokenizer=False)
  cases["notok.gguf"] = r"has no tokenizer metadata"
  write_gguf(random_model(), tmp_path / "rope.gguf", extra=lambda w: w.add_array("llama.rope.freqs", [1.0]))
  cases["rope.gguf"] = r"llama\.rope\.freqs=\[1\.0\] is not supported"
  for name, match in cases.items():
    out = tmp_path / f"out-{name}"
    with pytest.raises(hf.HFConversionError, match=match):
      analyze_hf(str(tmp_path / name), out=str(out), num_sequences=4, seq_len=16, options=FAST)
    assert not out.exists(), name
  (tmp_path / "two").mkdir()
  for n in ("a.gguf", "b.gguf"):
    (tmp_path / "two" / n).write_bytes(data)
  with pytest.raises(hf.HFConversionError, match=r"holds 2 GGUF files \(a\.gguf, b\.gguf\): pass the file itself"):
    hf.load_hf(str(tmp_path / "two"), seq_len=16)
  (tmp_path / "notes.txt").write_text("hello")
  with pytest.raises(hf.HFConversionError, match=r"is a file but not a GGUF file"):
    hf.load_hf(str(tmp_path / "notes.txt"), seq_len=16)


def test_a_directory_holding_one_gguf_is_read(tiny_gguf):
  config, _, _ = hf.load_hf(str(tiny_gguf.parent), seq_len=16)
  assert config.model.num_layers == 2


def test_analysis_of_a_gguf_records_its_source_bos_and_variant(tiny_gguf, tmp_path):
  """BOS by token, documents separated by another token, the main policy chosen; an NTK variant."""
  out = tmp_path / "a"
  r = analyze_hf(str(tiny_gguf), out=str(out), num_sequences=4, seq_len=16, bos="<eos>", eos="10",
                 main_policy="none", variant=variants.Variant(ntk_alpha=4.0), options=FAST)
  meta = json.loads((out / "summary.json").read_text())["meta"]
  assert meta["checkpoint"]["format"] == "gguf" and meta["checkpoint"]["tensor_types"] == {"F32": 5, "Q8_0": 15}
  assert meta["checkpoint"]["files"]["tiny.gguf"]["sha256"]
  tok = meta["tokenizer"]
  assert (tok["bos_id"], tok["bos_token"], tok["eos_id"], tok["main_policy"]) == (257, "<eos>", 10, "none")
  assert r.summary["main_policy"] == "none" and (r.stats["tokens_prepend"][:, 0] == 257).all()
  assert meta["variant"]["rope_scale"] == "ntk:4" and meta["position"] == "ntk"
  assert np.isfinite(meta["variant"]["loss_unmodified"]) and meta["variant"]["loss_unmodified"] != r.summary["loss"][
      "none"]
  report = (out / "report.md").read_text()
  assert "gguf, MOSTLY_Q8_0" in report and "held-out loss of the unmodified model" in report
  with pytest.raises(ValueError, match=r"--bos='<nosuch>' is not a token of this tokenizer's vocabulary"):
    analyze_hf(str(tiny_gguf), out=str(tmp_path / "b"), num_sequences=4, seq_len=16, bos="<nosuch>", options=FAST)
  with pytest.raises(ValueError, match=r"--bos=999: not a token id of this model \(vocab_size 320\)"):
    analyze_hf(str(tiny_gguf), out=str(tmp_path / "b"), num_sequences=4, seq_len=16, bos="999", options=FAST)
  assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_analyze_cli_reads_a_gguf_file(tiny_gguf, tmp_path):
  out = tmp_path / "cli"
  r = subprocess.run([sys.executable, os.path.join(ROOT, "analyze.py"), f"--hf={tiny_gguf}", f"--out={out}",
                      "--num_sequences=4", "--seq_len=16", "--skip_interventions", "--bos=<bos>",
                      "--data=stdlib_prose", "--split=train", "--window=4"],
                     capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  s = json.loads((out / "summary.json").read_text())
  assert s["main_policy"] == "prepend" and s["position"] == "swa"
  assert s["meta"]["texts"] == {"name": "stdlib_prose", "split": "train"} and s["meta"]["variant"]["window"] == 4
  assert "residual-stream share" in r.stdout
