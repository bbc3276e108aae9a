"""Hugging Face interop: import parity per family, export round trips, analysis of imported models, bad inputs.

Every model is a small random one built here with transformers (nothing is
downloaded); parity is the max abs logit difference against transformers' own
float32 forward.
"""

import json
import os
import subprocess
import sys


os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from abspos_jax import checkpoint, data, variants
from abspos_jax import model as model_lib
from abspos_jax.config import base_config
from abspos_jax.analysis import AnalysisOptions, analyze_hf, analyze_run
from abspos_jax.analysis.api import TextChoice
from abspos_jax.interop import hf
from abspos_jax.train_loop import train
from conftest import small_config, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOL = 1e-4
VOCAB = 300
FAST = AnalysisOptions(interventions=False, progress=False, batch_size=8)
FAMILIES = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}


def hf_model(family: str, out, *, std: float = 0.15, shard: str | None = None, tokenizer: bool = False, **fields):
  """A random float32 transformers model of ``family`` saved to ``out``: weights and biases ~ N(0, std^2), norm
  scales 1 + N(0, std^2); large enough that attention is far from uniform and positions matter."""
  cfg_cls, model_cls = FAMILIES[family]
  kw = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=256, eos_token_id=257)
  torch.manual_seed(0)
  model = model_cls(cfg_cls(**{**kw, **fields})).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.add_(torch.randn_like(p) * std)
      else:
        p.normal_(0.0, std)
  model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
  if tokenizer:
    hf.write_byte_tokenizer(str(out), add_bos=True, max_len=256)
  return model


def env() -> dict:
  """The subprocess environment, read when called (conftest sets ABSPOS_DATA_DIR for the session)."""
  return {**os.environ, "HF_HUB_OFFLINE": "1", "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=1")}


def tokens(t: int = 24, batch: int = 2, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, VOCAB, (batch, t))


def hf_logits(model, x: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.tensor(x)).logits.float().numpy()


def max_diff(a, b) -> float:
  return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


CASES = {
    "llama_gqa": ("llama", {}),
    "llama_tied_theta_eps": ("llama", {"tie_word_embeddings": True, "rope_theta": 5e5, "rms_norm_eps": 1e-5,
                                       "num_key_value_heads": 4}),
    "mistral_window5": ("mistral", {"sliding_window": 5}),
    "qwen2_biases": ("qwen2", {}),
    "qwen2_sliding_upper_layer": ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_matches_transformers(case, tmp_path):
  family, fields = CASES[case]
  ref = hf_model(family, tmp_path, **fields)
  config, ours, _ = hf.load_hf(str(tmp_path), seq_len=24)
  x = tokens()  # 24 tokens: longer than every sliding window here
  diff = max_diff(ours(jnp.asarray(x)), hf_logits(ref, x))
  print(f"parity {case}: max abs logit diff {diff:.2e}")
  assert diff < TOL
  m = config.model
  assert (m.num_kv_heads, m.qkv_bias) == (fields.get("num_key_value_heads", 2), family == "qwen2")
  assert ours.blocks[0].attn.wk.shape == (64, m.num_kv_heads, 16)
  if case == "mistral_window5":
    assert (m.position, m.window) == ("swa", 5)
  if case == "qwen2_sliding_upper_layer":
    assert (m.position, m.window, m.layer_pattern) == ("swa", 4, "GL")


def test_sliding_window_convention_is_exact(tmp_path):
  """transformers' sliding_window=W is our window W (W keys, the query included): W +- 1 do not match."""
  ref = hf_model("mistral", tmp_path, sliding_window=5)
  x, cfg, tensors = tokens(), hf.read_config(str(tmp_path)), hf.load_safetensors(str(tmp_path))
  want = hf_logits(ref, x)
  diffs = {}
  for w in (4, 5, 6):
    model = hf.params_from_hf(tensors, hf.config_from_hf({**cfg, "sliding_window": w}, seq_len=24))
    diffs[w] = max_diff(model(jnp.asarray(x)), want)
  assert diffs[5] < TOL and diffs[4] > 1e-2 and diffs[6] > 1e-2, diffs


def test_sharded_checkpoint(tmp_path):
  ref = hf_model("llama", tmp_path, shard="60KB")
  assert os.path.exists(tmp_path / hf.INDEX) and not os.path.exists(tmp_path / hf.WEIGHTS)
  _, ours, _ = hf.load_hf(str(tmp_path), seq_len=24)
  assert max_diff(ours(jnp.asarray(tokens())), hf_logits(ref, tokens())) < TOL
  shard = sorted(set(json.loads((tmp_path / hf.INDEX).read_text())["weight_map"].values()))[-1]
  os.remove(tmp_path / shard)
  with pytest.raises(FileNotFoundError, match=f"{shard} is listed in {hf.INDEX} but missing"):
    hf.load_hf(str(tmp_path), seq_len=24)


def test_gqa_hooks_are_per_query_head(tmp_path):
  hf_model("llama", tmp_path)
  _, ours, _ = hf.load_hf(str(tmp_path), seq_len=24)
  from abspos_jax.hooks import Hooks
  hooks = Hooks(capture=["blocks.0.attn.logits", "blocks.0.attn.weights"])
  ours(jnp.asarray(tokens()), hooks=hooks)
  assert hooks.cache["blocks.0.attn.logits"].shape == (2, 4, 24, 24)
  np.testing.assert_allclose(hooks.cache["blocks.0.attn.weights"].sum(-1), 1.0, rtol=1e-5)


# --------------------------------------------------------------------------- export round trips


def run_config(position: str):
  return small_config(position, **{"train.steps": 2,
                                   "train.eval_every": 2, "checkpoint.every": 2})


class _Runs(dict):
  """``runs[position]``: the workdir of a run trained for 2 steps, trained on first use (each xdist worker
  trains only the positions its tests need)."""

  def __init__(self, factory):
    super().__init__()
    self._factory = factory

  def __missing__(self, position: str) -> str:
    d = str(self._factory.mktemp(position))
    train(run_config(position), d)
    self[position] = d
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """rope, ntk and swa runs (swa: window 4 < seq_len 16)."""
  return _Runs(tmp_path_factory)


@pytest.mark.parametrize("position,family", [("rope", "llama"), ("ntk", "llama"), ("swa", "mistral")])
def test_export_round_trip(runs, position, family, tmp_path):
  config, ours, _ = checkpoint.load_model(runs[position])
  out = str(tmp_path / "hf")
  hf.export(config, ours, out)
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))
  written = json.loads(open(os.path.join(out, "config.json")).read())
  assert written["model_type"] == family
  assert written["rope_theta"] == pytest.approx(ours.spec.attention_base())
  if position == "ntk":  # the NTK base, not the configured rope_base
    assert written["rope_theta"] == pytest.approx(10000.0 * 8.0 ** (8 / 6))
  if position == "swa":
    assert written["sliding_window"] == 4
  ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  assert type(ref).__name__ == hf.ARCHITECTURES[family]
  x = np.asarray(data.eval_sequences(config.data, num_sequences=4)[:, :-1])  # 16 tokens > window 4
  mine = np.asarray(ours(jnp.asarray(x)))
  diff = max_diff(mine, hf_logits(ref, x))
  print(f"export parity {position} -> {family}: max abs logit diff {diff:.2e}")
  assert diff < TOL
  _, back, _ = hf.load_hf(out, seq_len=16)  # and back again
  assert max_diff(back(jnp.asarray(x)), mine) < TOL
  # After 2 steps attention is nearly uniform, so the RoPE base and the window barely move the logits.
  # Sharpen it (q, k x 8) so they matter, and check that a wrong base or window would be caught.
  for block in ours.blocks:
    block.attn.wq[...] = block.attn.wq[...] * 8.0
    block.attn.wk[...] = block.attn.wk[...] * 8.0
  sharp = str(tmp_path / "sharp")
  hf.export(config, ours, sharp)
  mine = np.asarray(ours(jnp.asarray(x)))
  diff = max_diff(mine, hf_logits(transformers.AutoModelForCausalLM.from_pretrained(sharp, dtype=torch.float32), x))
  print(f"  sharpened (q, k x 8): max abs logit diff {diff:.2e}")
  assert diff < TOL
  cfg = json.loads(open(os.path.join(sharp, "config.json")).read())
  if position == "swa":
    cfg["sliding_window"] = 5
  else:  # rope: another base; ntk: the configured rope_base instead of the NTK base
    theta = 10000.0 if position == "ntk" else 1000.0
    cfg["rope_theta"], cfg["rope_parameters"]["rope_theta"] = theta, theta
  with open(os.path.join(sharp, "config.json"), "w") as f:
    json.dump(cfg, f)
  wrong = max_diff(mine, hf_logits(transformers.AutoModelForCausalLM.from_pretrained(sharp, dtype=torch.float32), x))
  print(f"  sharpened: wrong {'window' if position == 'swa' else 'base'} gives {wrong:.2e}")
  assert wrong > 1e-3  # measured 1.5e-2 (ntk) to 8e-2 (swa); a right one gives < 1e-6
  tok = transformers.AutoTokenizer.from_pretrained(out)
  text = "def f(x):\n  return 'é' <bos>"
  assert tok(text).input_ids == [256] + list(data.encode(text))


def test_export_cli(runs, tmp_path):
  out = tmp_path / "hf"
  r = subprocess.run([sys.executable, "-m", "abspos_jax.export_hf", f"--workdir={runs['swa']}", f"--out={out}"],
                     cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "MistralForCausalLM" in r.stdout and json.loads((out / "config.json").read_text())["sliding_window"] == 4
  (tmp_path / "foreign").mkdir()
  (tmp_path / "foreign" / "notes.txt").write_text("mine")
  r = subprocess.run([sys.executable, "-m", "abspos_jax.export_hf", f"--workdir={runs['swa']}",
                      f"--out={tmp_path / 'foreign'}"], cwd=ROOT, env=env(), capture_output=True, text=True,
                     timeout=300)
  assert r.returncode != 0 and "is not a previous export" in r.stderr
  assert os.listdir(tmp_path / "foreign") == ["notes.txt"]


@pytest.mark.parametrize("position,why", [("nope", "without any position signal"),
                                          ("learned", "no learned absolute position")])
def test_export_refuses_nope_and_learned(position, why, tmp_path):
  config = small_config(position)
  with pytest.raises(hf.HFConversionError, match=f"model.position='{position}' is not supported: .*{why}"):
    hf.export(config, model_lib.create(config), str(tmp_path / "hf"))
  assert not os.path.exists(tmp_path / "hf")


def test_export_qwen2_for_biases_and_layer_patterns(tmp_path):
  """A local/global pattern (Mistral windows every layer) and q/k/v biases export as Qwen2, exactly."""
  config = small_config("swa", **{"model.layer_pattern": "LG", "model.num_kv_heads": 2, "model.qkv_bias": True})
  ours = model_lib.create(config, seed=1)
  for block in ours.blocks:  # non-zero biases, so they are checked too
    block.attn.bq[...] = jnp.full(block.attn.bq.shape, 0.3)
    block.attn.bk[...] = jnp.linspace(-1.0, 1.0, block.attn.bk.size).reshape(block.attn.bk.shape)
  hf.export(config, ours, str(tmp_path))
  written = json.loads((tmp_path / "config.json").read_text())
  assert written["model_type"] == "qwen2" and written["layer_types"] == ["sliding_attention", "full_attention"]
  ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
  x = tokens(16, seed=3) % 259
  assert max_diff(ours(jnp.asarray(x)), hf_logits(ref, x)) < TOL


# --------------------------------------------------------------------------- analysis of imported models


def test_bos_convention_and_sequences(tmp_path):
  a, b, c, d = (tmp_path / n for n in "abcd")
  for p in (a, b, c, d):
    p.mkdir()
  hf.write_byte_tokenizer(str(a), add_bos=True, max_len=64)
  hf.write_byte_tokenizer(str(b), add_bos=False, max_len=64)  # Qwen2 style: a BOS id, not added
  hf.byte_tokenizer(False).save(str(c / hf.TOKENIZER))  # no tokenizer_config.json, no post-processor
  hf.byte_tokenizer(True).save(str(d / hf.TOKENIZER))  # only the post-processor adds BOS
  conv = {p.name: hf.bos_convention(str(p), hf.load_tokenizer(str(p)), {"bos_token_id": 256}) for p in (a, b, d)}
  conv["c"] = hf.bos_convention(str(c), hf.load_tokenizer(str(c)), {})
  assert (conv["a"].bos_id, conv["a"].adds, conv["a"].eos_id) == (256, True, 257)
  assert (conv["b"].bos_id, conv["b"].adds) == (256, False)
  assert (conv["c"].bos_id, conv["c"].adds, conv["c"].eos_id) == (None, False, None)
  assert (conv["d"].bos_id, conv["d"].adds, conv["d"].source) == (256, True, "tokenizer.json post-processor")
  stream = np.arange(100) % 250
  seqs = hf.analysis_sequences(stream, num_sequences=4, seq_len=8, conv=conv["a"], vocab_size=VOCAB)
  assert (seqs["prepend"][:, 0] == 256).all()
  np.testing.assert_array_equal(seqs["prepend"][:, 1:], seqs["none"][:, :-1])
  assert set(hf.analysis_sequences(stream, num_sequences=4, seq_len=8, conv=conv["c"], vocab_size=VOCAB)) == {"none"}
  with pytest.raises(ValueError, match="only 12 windows"):
    hf.analysis_sequences(stream, num_sequences=13, seq_len=8, conv=conv["a"], vocab_size=VOCAB)


def bpe_tokenizer(path):
  """A ``tokenizers.Tokenizer``: Llama-style BPE with merges (trained on this file), ``<s>`` prepended by its
  post-processor."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"], show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  with open(__file__) as f:
    tok.train_from_iterator([f.read()], trainer)
  tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
  tok.save(str(path))
  return tok


def test_analysis_of_imported_gqa_model(tmp_path):
  """A random GQA Llama with its own BPE tokenizer (BOS <s> = 0 added by tokenizer.json; no tokenizer_config)."""
  hf_model("llama", tmp_path / "hf", bos_token_id=0, eos_token_id=1)
  tok = bpe_tokenizer(tmp_path / "hf" / hf.TOKENIZER)
  assert tok.get_vocab_size() == VOCAB and len(tok.encode("def tokens(t: int)").ids) < 18  # merges at work
  r = analyze_hf(str(tmp_path / "hf"), out=str(tmp_path / "out"), num_sequences=16, seq_len=32, options=FAST)
  s = r.summary
  print("smoke analysis of an imported random Llama (GQA 4q/2kv):", json.dumps({
      "loss": s["loss"], "components.pooled": s["components"]["pooled"],
      "components.pooled_early": s["components"]["pooled_early"], "sink_score_max": s["sink_score_max"],
      "position0.norm_ratio": s["position0"]["norm_ratio"], "fingerprint.bos": s["fingerprint"]["bos"],
      "fingerprint.no_bos": s["fingerprint"]["no_bos"], "probes.residual_r2": s["probes"]["residual_r2"],
      "closedness": s["closedness_max_abs_diff"]}))
  assert s["main_policy"] == "prepend" and s["num_heads"] == 4
  assert r.stats["log_z"].shape == (2, 4, 32) and (r.stats["tokens"][:, 0] == 0).all()
  assert s["closedness_max_abs_diff"] == 0.0 and max(s["fingerprint"]["bos"]) < 1e-5
  assert min(s["fingerprint"]["no_bos"][1:]) > 1e-3
  pooled = s["components"]["pooled"]
  assert abs(pooled["causal_mask"] + pooled["residual_stream"] - 1) < 1e-4
  meta = json.loads((tmp_path / "out" / "summary.json").read_text())["meta"]
  assert (meta["tokenizer"]["bos_id"], meta["tokenizer"]["eos_id"], meta["tokenizer"]["adds_bos"]) == (0, 1, True)
  assert meta["tokenizer"]["from"] == "tokenizer.json post-processor"
  assert meta["options"]["bos_replace_token"] == tok.token_to_id("Ċ")  # the newline token, not byte 10
  # Window 0 is the start of the first validation document, in this tokenizer's ids.
  first_doc = bytes(data.get_data_sources(base_config().data)["validation"][0]["text"]).decode()
  assert first_doc.startswith(tok.decode(r.stats["tokens_none"][0].tolist())) and len(first_doc) > 32


def test_analysis_reads_the_users_texts(runs, tmp_path):
  """--data for runs and for --hf: the user's files (tokenised with each model's own tokenizer), the stdlib's
  prose; recorded in meta; an empty corpus, or files without text_files, refused before any work."""
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  text = "The quick brown fox jumps over the lazy dog. " * 40
  (corpus / "a.txt").write_text(text)
  files = TextChoice(name="text_files", files=str(corpus / "*.txt"))
  r = analyze_run(runs["rope"], out=str(tmp_path / "run"), num_sequences=4, split="train", texts=files, options=FAST)
  meta = json.loads((tmp_path / "run" / "summary.json").read_text())["meta"]
  assert meta["texts"] == {"name": "text_files", "split": "train", "files": str(corpus / "*.txt")}
  assert bytes(r.stats["tokens_none"][0].astype(np.uint8)).decode() in text  # bytes of the user's text
  hf_model("llama", tmp_path / "hf", tokenizer=True)
  r = analyze_hf(str(tmp_path / "hf"), out=str(tmp_path / "hfout"), num_sequences=4, seq_len=16, split="train",
                 texts=TextChoice(name="stdlib_prose"), options=FAST)
  assert json.loads((tmp_path / "hfout" / "summary.json").read_text())["meta"]["texts"]["name"] == "stdlib_prose"
  from pydoc_data.topics import topics
  assert bytes(r.stats["tokens_none"][0].astype(np.uint8)).decode() in "".join(topics[k] for k in sorted(topics))
  (corpus / "empty").mkdir()
  (corpus / "empty" / "e.txt").write_text("")
  for choice, match in ((TextChoice(name="text_files", files=str(corpus / "empty" / "*.txt")), "matched files are empty"),
                        (TextChoice(name="text_files", files=""), "needs --data_files"),
                        (TextChoice(files=str(corpus / "*.txt")), "with --data=text_files only")):
    with pytest.raises(ValueError, match=match):
      analyze_hf(str(tmp_path / "hf"), out=str(tmp_path / "bad"), num_sequences=4, seq_len=16, split="train",
                 texts=choice, options=FAST)
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_interventions_on_imported_model(tmp_path):
  hf_model("mistral", tmp_path / "hf", tokenizer=True, sliding_window=6)
  # "Another token" := BOS itself: that replacement must remove nothing.
  r = analyze_hf(str(tmp_path / "hf"), out=str(tmp_path / "out"), num_sequences=8, seq_len=16,
                 bos_replace_token=256, options=AnalysisOptions(progress=False, batch_size=8))
  iv = r.summary["interventions"]
  assert set(iv) == {"bos_replace", "pos0_patch", "sink_ablate"} and iv["bos_replace"]["token_id"] == 256
  token = iv["bos_replace"]["token"]
  for comp in ("causal_mask", "residual_stream"):
    for suffix in ("", "_early"):  # nats^2: the same inputs, so no change beyond float rounding
      change, before = token[f"{comp}_change{suffix}"], token[f"{comp}_before{suffix}"]
      assert abs(change) <= 1e-4 * abs(before) + 1e-7, (comp, suffix, change, before)
  # The mask component is clearly non-zero, so its fraction is defined, and it is ~0.
  assert token["causal_mask_removed"] is not None and abs(token["causal_mask_removed"]) < 1e-4
  removed = token["residual_stream_removed"]
  assert (removed is None and "residual_stream_removed_reason" in token) or abs(removed) < 1e-4


def test_analysis_of_an_export_equals_the_runs_own(runs, tmp_path):
  """Export then analyse with --hf: the byte tokenizer rebuilds the run's sequences, so the results agree."""
  config, ours, _ = checkpoint.load_model(runs["rope"])
  hf.export(config, ours, str(tmp_path / "hf"))
  native = analyze_run(runs["rope"], out=str(tmp_path / "a"), num_sequences=8, options=FAST)
  imported = analyze_hf(str(tmp_path / "hf"), out=str(tmp_path / "b"), num_sequences=8, seq_len=16,
                        data_cfg=config.data, options=FAST)
  np.testing.assert_array_equal(imported.stats["tokens"], native.stats["tokens"])
  np.testing.assert_array_equal(imported.stats["tokens_none"], native.stats["tokens_none"])
  for name in ("log_z", "sink_mass", "phi_loga", "share_res", "pos0_norm"):
    np.testing.assert_allclose(imported.stats[name], native.stats[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_analyze_cli_hf(tmp_path):
  hf_model("qwen2", tmp_path / "hf")
  hf.write_byte_tokenizer(str(tmp_path / "hf"), add_bos=False, max_len=256)  # Qwen2 style: no BOS added
  out = tmp_path / "out"
  r = subprocess.run([sys.executable, "analyze.py", f"--hf={tmp_path / 'hf'}", f"--out={out}", "--num_sequences=8",
                      "--seq_len=16", "--batch_size=8", "--skip_interventions"], cwd=ROOT, env=env(),
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "residual-stream share" in r.stdout
  s = json.loads((out / "summary.json").read_text())
  assert s["main_policy"] == "none" and s["meta"]["model_type"] == "qwen2" and s["meta"]["position"] == "rope"
  assert "bos" in s["fingerprint"]  # config.json names a BOS id: the prepend policy is analysed too
  assert {"report.md", "stats.npz", "log_z.png"} <= set(os.listdir(out))
  r = subprocess.run([sys.executable, "analyze.py", f"--hf={tmp_path / 'absent'}"], cwd=ROOT, env=env(),
                     capture_output=True, text=True, timeout=300)
  assert r.returncode != 0 and "absent does not exist" in r.stderr


# --------------------------------------------------------------------------- bad inputs


@pytest.fixture
def llama_dir(tmp_path):
  hf_model("llama", tmp_path / "hf")
  return tmp_path / "hf"


def edit_config(d, **fields):
  cfg = json.loads((d / "config.json").read_text())
  cfg.update(fields)
  (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("fields,match", [
    ({"model_type": "gpt2"}, r"model_type='gpt2' is not supported: supported families: llama, mistral, qwen2"),
    ({"architectures": ["LlamaForSequenceClassification"]}, r"architectures=.* only the causal LM LlamaForCausalLM"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     r"rope_parameters\.rope_type='linear' is not supported"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"rope_scaling\.rope_type='dynamic' is not supported"),
    ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor=0\.5 is not supported"),
    ({"head_dim": 32}, r"head_dim=32 is not supported"),
    ({"attention_bias": True}, r"attention_bias=True is not supported"),
    ({"hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
    ({"num_key_value_heads": 3}, r"num_key_value_heads=3 is not supported: must divide num_attention_heads=4"),
    ({"attn_logit_softcapping": 30.0}, r"attn_logit_softcapping=30\.0 is not supported: .*does not know"),
    ({"max_position_embeddings": 8}, r"max_position_embeddings=8 is not supported: shorter than the 24 tokens"),
])
def test_unsupported_config_fields_are_named(llama_dir, fields, match):
  edit_config(llama_dir, **fields)
  with pytest.raises(hf.HFConversionError, match=match):
    hf.load_hf(str(llama_dir), seq_len=24)


# config.json as published on the Hub (typed in, nothing downloaded).
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0,
    "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536, "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama",
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
    "vocab_size": 49152}
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936, "use_mrope": False}
MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}


def test_published_hub_configs_load_or_are_refused_by_name():
  """Metadata fields load as published; a field that changes the computation is refused by name, and
  --hf_ignore_fields drops it on the user's word."""
  m = hf.config_from_hf(SMOLLM2_135M, seq_len=128).model
  assert (m.num_layers, m.d_model, m.num_heads, m.num_kv_heads, m.rope_base, m.tie_embeddings) == (30, 576, 9, 3,
                                                                                                 1e5, True)
  m = hf.config_from_hf(QWEN25_05B, seq_len=128).model
  assert (m.position, m.qkv_bias, m.num_kv_heads, m.rope_base) == ("rope", True, 2, 1e6)  # no sliding: flag off
  m = hf.config_from_hf(MISTRAL_7B_V01, seq_len=128).model
  assert (m.position, m.window, m.tie_embeddings) == ("swa", 4096, False)
  with pytest.raises(hf.HFConversionError, match=r"rope_scaling\.rope_type='llama3' is not supported"):
    hf.config_from_hf(LLAMA_32_1B, seq_len=128)
  assert hf.config_from_hf(LLAMA_32_1B, seq_len=128, ignore=["rope_scaling"]).model.rope_base == 5e5
  with pytest.raises(hf.HFConversionError, match=r"--hf_ignore_fields names rope_scalng, which it does not have"):
    hf.config_from_hf(LLAMA_32_1B, seq_len=128, ignore=["rope_scalng"])
  for field, value in (("use_mrope", True), ("rope_interleaved", True), ("auto_map", {"AutoModel": "x.Y"}),
                       ("quantization_config", {"quant_method": "gptq"})):
    with pytest.raises(hf.HFConversionError, match=rf"{field}=.* is not supported"):
      hf.config_from_hf({**SMOLLM2_135M, field: value}, seq_len=128)


def test_an_ntk_variant_reaches_alpha_times_the_trained_context():
  """SmolLM2 (8,192 positions): 16,384 tokens are refused as they are, allowed with ntk:2 (the usual 2x context
  extension), and 16,385 are still refused there, naming the field and the way out."""
  with pytest.raises(hf.HFConversionError, match=r"max_position_embeddings=8192 .* 16384 tokens asked for "
                     r"\(--rope_scale=ntk:ALPHA"):
    hf.config_from_hf(SMOLLM2_135M, seq_len=16384)
  assert hf.config_from_hf(SMOLLM2_135M, seq_len=16384, context_scale=variants.Variant(ntk_alpha=2).context_scale())
  with pytest.raises(hf.HFConversionError, match=r"16385 tokens asked for even extended 2 times by the variant"):
    hf.config_from_hf(SMOLLM2_135M, seq_len=16385, context_scale=2.0)
  assert variants.Variant(window=64).context_scale() == 1.0 and variants.Variant().context_scale() == 1.0


def test_rope_base_spellings():
  """transformers >= 5 writes rope_parameters (and a null top-level rope_theta); older files the top level."""
  base = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
          "intermediate_size": 64, "vocab_size": 300}

  def base_of(**fields) -> float:
    return hf.config_from_hf({**base, **fields}, seq_len=8).model.rope_base

  assert base_of(rope_parameters={"rope_type": "default", "rope_theta": 5e5}, rope_theta=None) == 5e5
  assert base_of(rope_theta=1e6, rope_scaling=None) == 1e6
  assert base_of(rope_theta=2e4, rope_scaling={"type": "default"}) == 2e4
  assert base_of() == 10000.0


def test_qwen2_inconsistent_layer_types(tmp_path):
  hf_model("qwen2", tmp_path)
  edit_config(tmp_path, layer_types=["sliding_attention", "full_attention"], use_sliding_window=False)
  with pytest.raises(hf.HFConversionError, match="layer_types=.* names sliding layers although use_sliding_window"):
    hf.load_hf(str(tmp_path), seq_len=24)


def test_missing_files(tmp_path, llama_dir):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    hf.load_hf(str(tmp_path / "absent"), seq_len=24)
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="has no config.json"):
    hf.load_hf(str(tmp_path / "empty"), seq_len=24)
  os.replace(llama_dir / "model.safetensors", llama_dir / "pytorch_model.bin")
  with pytest.raises(FileNotFoundError, match="found pytorch_model.bin: convert to safetensors first"):
    hf.load_hf(str(llama_dir), seq_len=24)
  with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
    analyze_hf(str(llama_dir), out=str(tmp_path / "out"), num_sequences=4, seq_len=16, options=FAST)
  assert not os.path.exists(tmp_path / "out")


def test_mismatched_missing_and_unexpected_tensors(llama_dir):
  path = llama_dir / "model.safetensors"
  tensors = load_file(str(path))
  edit_config(llama_dir, intermediate_size=80)
  shape = r"tensor model\.layers\.0\.mlp\.down_proj\.weight has shape \[64, 96\], config.json implies \[64, 80\]"
  with pytest.raises(hf.HFConversionError, match=shape):
    hf.load_hf(str(llama_dir), seq_len=24)
  edit_config(llama_dir, intermediate_size=96)
  save_file({k: v for k, v in tensors.items() if k != "model.norm.weight"}, str(path))
  with pytest.raises(hf.HFConversionError, match="missing tensors model.norm.weight"):
    hf.load_hf(str(llama_dir), seq_len=24)
  save_file({**tensors, "model.layers.0.self_attn.q_norm.weight": np.ones(16, np.float32)}, str(path))
  with pytest.raises(hf.HFConversionError, match="unexpected tensors model.layers.0.self_attn.q_norm.weight"):
    hf.load_hf(str(llama_dir), seq_len=24)
  path.write_bytes(b"not a safetensors file")
  with pytest.raises(hf.HFConversionError, match="cannot be read as safetensors"):
    hf.load_hf(str(llama_dir), seq_len=24)


def test_core_package_does_not_import_the_extra():
  code = ("import sys, abspos_jax.model, abspos_jax.analysis, abspos_jax.train_loop, abspos_jax.interop.hf; "
          "print(sorted(m for m in ('torch', 'transformers', 'safetensors', 'tokenizers') if m in sys.modules))")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr[-2000:]
