"""The Bigram-Backcopy language: construction, exact statistics, loss floor, dataset."""

import math
import re

import numpy as np
import pytest

from abspos_jax import data
from abspos_jax.config import ConfigError, base_config, validate
from abspos_jax.data import backcopy, builders
from abspos_jax.data.tokenizer import BOS_ID, EOS_ID

SIGMAS = 5.0  # tolerance of the sampling checks, in standard deviations (fixed seeds: deterministic)


def docs(params, n, split="validation"):
  return [backcopy.generate_annotated_document(backcopy.document_rng(params, split, i), params) for i in range(n)]


def test_generator_is_seeded_and_uses_its_alphabets():
  params = backcopy.BackcopyParams(seed=3, symbols=10, triggers=2, mean_len=300)
  doc = lambda p, i, split="train": backcopy.generate_document(backcopy.document_rng(p, split, i), p)
  assert doc(params, 0) == doc(params, 0) and doc(params, 0) != doc(params, 1)
  assert doc(params, 0) != doc(params, 0, "validation")
  assert doc(params, 0) != doc(backcopy.BackcopyParams(seed=4, symbols=10, triggers=2, mean_len=300), 0)
  text = "".join(doc(params, i) for i in range(20))
  assert set(text) == set("abcdefghij") | {"A", "B"}  # exactly the first 10 symbols and 2 triggers
  assert list(backcopy.split_documents(params, "train", 3)) == [doc(params, i) for i in range(3)]


def test_labels_copies_and_successors_follow_the_construction():
  params = backcopy.BackcopyParams(p_trigger=0.3, mean_len=200)
  ch = backcopy.chain(params)
  sym = {c: i for i, c in enumerate(backcopy.SYMBOL_ALPHABET)}
  for d in docs(params, 50):
    text = np.frombuffer(d.text.encode(), np.uint8)
    is_trig = np.array([chr(b).isupper() for b in text])
    copy = d.labels == backcopy.COPY
    where = np.nonzero(copy)[0]
    # A copy is the byte before the trigger just before it.
    assert np.array_equal(d.source[copy], where - 2) and (d.source[~copy] == -1).all()
    assert np.array_equal(text[copy], text[d.source[copy]]) and is_trig[where - 1].all()
    # Every trigger is followed by its copy; nothing else is FRESH but the first byte.
    assert np.array_equal(np.nonzero(is_trig)[0] + 1, where)
    assert np.array_equal(np.nonzero(d.labels == backcopy.FRESH)[0], np.r_[0, np.nonzero(is_trig)[0]])
    assert d.num_triggers == len(re.findall("[A-Z]", d.text)) and not is_trig[-1]
    # LOCAL bytes are successors of the byte before them.
    for i in np.nonzero(d.labels == backcopy.LOCAL)[0]:
      assert sym[d.text[i]] in ch.successors[sym[d.text[i - 1]]]


def test_trigger_and_length_rates_are_binomial():
  params = backcopy.BackcopyParams(p_trigger=0.2, mean_len=100)
  p, e, n = params.p_trigger, params.p_end, 400
  sample = docs(params, n)
  local = sum(int((d.labels == backcopy.LOCAL).sum()) for d in sample)
  triggers = sum(d.num_triggers for d in sample)
  cont = local + triggers  # continuations: each independently a trigger with probability p
  assert abs(triggers - p * cont) <= SIGMAS * math.sqrt(cont * p * (1 - p))
  # Continuations per document ~ Geometric(e) - 1: mean (1-e)/e, variance (1-e)/e^2.
  assert abs(cont - n * (1 - e) / e) <= SIGMAS * math.sqrt(n * (1 - e)) / e
  stats = backcopy.backcopy_statistics(params, split="validation", num_docs=n)
  total = sum(len(d.text) for d in sample)
  assert stats["copy_fraction"] == pytest.approx(triggers / total)
  assert stats["attention_target_fraction"] == pytest.approx(triggers / (total + n))
  assert stats["local_fraction"] + stats["fresh_fraction"] + stats["copy_fraction"] == pytest.approx(1.0)
  # Byte shares: delta-method std of the copy share from the binomial trigger count.
  std = math.sqrt(cont * p * (1 - p)) / ((1 + p) * total)
  assert abs(stats["copy_fraction"] - stats["expected_copy_fraction"]) <= SIGMAS * std
  assert stats["expected_bytes_per_doc"] == pytest.approx(100)


def test_expected_shares_and_entropies_in_closed_form():
  params = backcopy.BackcopyParams(p_trigger=0.25, triggers=3, branching=5, mean_len=40)
  ex = backcopy.expected_statistics(params)
  p, e, n_t = 0.25, params.p_end, 3
  assert e == pytest.approx(1.25 / 40.25)
  copies = p * (1 - e) / e
  assert ex["bytes_per_doc"] == pytest.approx(40) and ex["triggers_per_doc"] == pytest.approx(copies)
  assert ex["copy_fraction"] == pytest.approx(copies / 40) and ex["fresh_fraction"] == pytest.approx((1 + copies) / 40)
  q = np.array([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5]) / (137 / 60)
  h = lambda x: -x * math.log(x) - (1 - x) * math.log(1 - x)
  assert ex["successor_entropy"] == pytest.approx(-(q * np.log(q)).sum())
  assert ex["step_entropy"] == pytest.approx(h(e) + (1 - e) * (h(p) + p * math.log(n_t) + (1 - p) * ex["successor_entropy"]))
  assert ex["loss_floor"] == pytest.approx((ex["first_entropy"] + ex["step_entropy"] / e) / 41)
  # Long documents: the copy share tends to p / (1 + p).
  long = backcopy.expected_statistics(backcopy.BackcopyParams(p_trigger=p, mean_len=backcopy.MAX_MEAN_LEN))
  assert long["copy_fraction"] == pytest.approx(p / (1 + p), rel=1e-5)
  # Without triggers attention earns nothing; with one successor only the end is uncertain.
  flat = backcopy.expected_statistics(backcopy.BackcopyParams(p_trigger=0.0, branching=1, mean_len=10))
  e0 = 1 / 10
  assert flat["attention_gain"] == 0 and flat["bigram_floor"] == flat["loss_floor"]
  assert flat["loss_floor"] == pytest.approx((flat["first_entropy"] + h(e0) / e0) / 11)


def test_true_model_nll_matches_the_loss_floors():
  params = backcopy.BackcopyParams(p_trigger=0.2, mean_len=60)
  ex = backcopy.expected_statistics(params)
  sample = docs(params, 500)
  nll = [backcopy.document_nll(d.text, params) for d in sample]
  assert all(np.isfinite(x).all() for x in nll)
  # Per document, S - floor * N has mean 0 (renewal reward); check it within its sampling error.
  resid = np.array([x.sum() - ex["loss_floor"] * len(x) for x in nll])
  assert abs(resid.mean()) <= SIGMAS * resid.std() / math.sqrt(len(resid))
  assert ex["bigram_floor"] - ex["loss_floor"] == pytest.approx(
      ex["triggers_per_doc"] * ex["copy_entropy_without_attention"] / 61)
  stats = backcopy.backcopy_statistics(params, num_docs=500)
  assert stats["true_model_nll"] == pytest.approx(sum(x.sum() for x in nll) / sum(len(x) for x in nll))


def test_copied_symbols_follow_the_decision_distribution():
  # Short documents, so π's dependence on the first-symbol law and on p is visible.
  params = backcopy.BackcopyParams(p_trigger=0.5, mean_len=4)
  pi = backcopy.decision_distribution(params)
  sym = {c: i for i, c in enumerate(backcopy.SYMBOL_ALPHABET)}
  copied = np.array([sym[d.text[i]] for d in docs(params, 2500) for i in np.nonzero(d.labels == backcopy.COPY)[0]])
  freq = np.bincount(copied, minlength=params.symbols) / len(copied)
  assert (np.abs(freq - pi) <= SIGMAS * np.sqrt(pi * (1 - pi) / len(copied)) + 1e-12).all()
  # Without attention a copy costs -log π(copied symbol); its mean is H(π).
  cost = -np.log(pi[copied])
  entropy = backcopy.expected_statistics(params)["copy_entropy_without_attention"]
  assert abs(cost.mean() - entropy) <= SIGMAS * cost.std() / math.sqrt(len(cost))


def test_document_nll_refuses_impossible_text():
  params = backcopy.BackcopyParams(p_trigger=0.3, mean_len=50)
  d = docs(params, 1)[0]
  i = int(np.nonzero(d.labels == backcopy.COPY)[0][0])
  wrong = next(c for c in backcopy.SYMBOL_ALPHABET[:params.symbols] if c != d.text[i])
  assert np.isfinite(backcopy.document_nll(d.text, params)).all()
  nll = backcopy.document_nll(d.text[:i] + wrong + d.text[i + 1:], params)
  assert np.isinf(nll[i]) and np.isfinite(nll[:i]).all()
  assert np.isinf(backcopy.document_nll("aA", params)[-1])  # a document never ends on a trigger


@pytest.mark.parametrize("field, value, message", [
    ("backcopy_symbols", 63, r"data\.backcopy_symbols must be an integer in \[2, 62\], got 63"),
    ("backcopy_symbols", 1, r"data\.backcopy_symbols must be an integer in \[2, 62\], got 1"),
    ("backcopy_triggers", 0, r"data\.backcopy_triggers must be an integer in \[1, 26\], got 0"),
    ("backcopy_p_trigger", 1.5, r"data\.backcopy_p_trigger must be in \[0, 1\], got 1\.5"),
    ("backcopy_branching", 40, r"data\.backcopy_branching must be an integer in \[1, data\.backcopy_symbols=36\]"),
    ("backcopy_mean_len", 0.5, r"data\.backcopy_mean_len must be in \[1, 1000000\], got 0\.5"),
    ("backcopy_zipf", -1.0, r"data\.backcopy_zipf must be >= 0, got -1\.0"),
    ("synthetic_seed", -1, r"data\.synthetic_seed must be >= 0, got -1"),
    ("synthetic_docs", 0, r"data\.synthetic_docs must be >= 1, got 0"),
])
def test_config_validation_names_the_field_and_range(field, value, message):
  c = base_config()
  c.data.name = "backcopy"
  c.data[field] = value
  with pytest.raises(ConfigError, match=rf"^config\.{message}"):
    validate(c, num_devices=1)
  c.data.name = "stdlib_text"  # the knobs of an unused language are not checked
  validate(c, num_devices=1)


def test_backcopy_dataset_builds_and_feeds_training_windows(tmp_path):
  cfg = base_config().data
  cfg.update(dict(name="backcopy", data_dir=str(tmp_path), synthetic_docs=6, backcopy_mean_len=150.0, seq_len=32))
  params = backcopy.params_from_config(cfg)
  sources = data.get_data_sources(cfg)
  got = {s: [src[i]["text"].decode() for i in range(len(src))] for s, src in sources.items()}
  assert got["train"] == list(backcopy.split_documents(params, "train", 6))
  assert got["validation"] == list(backcopy.split_documents(params, "validation", 10))  # max(10, 6 // 10)
  batch = next(data.train_iterator(cfg, batch_size=4, seed=0))["tokens"]
  assert batch.shape == (4, 33) and (batch[:, 0] == BOS_ID).all()
  allowed = set(data.encode(backcopy.SYMBOL_ALPHABET[:36] + backcopy.TRIGGER_ALPHABET[:4]).tolist()) | {EOS_ID}
  assert set(batch[:, 1:].ravel().tolist()) <= allowed
  # A changed knob gets its own build; the synthetic language keeps its own builder.
  name = builders.synthetic_config(cfg).name
  cfg.backcopy_p_trigger = 0.2
  assert builders.synthetic_config(cfg).name != name
  assert builders.synthetic_config(cfg).params == backcopy.BackcopyParams(p_trigger=0.2, mean_len=150.0)
