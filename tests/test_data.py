"""Data layer: tokenizer, TFDS builders, synthetic language, grain pipeline."""

import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import grain
import numpy as np
import pytest
import tensorflow_datasets as tfds

from abspos_jax import data
from abspos_jax.data import builders, synthetic
from abspos_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

_BASE = Path(__file__).resolve().parents[1] / "configs" / "base.py"


def data_config(data_dir, **overrides):
  """The `data` block of configs/base.py with `overrides` and our own data dir."""
  spec = importlib.util.spec_from_file_location("abspos_base_config_for_data_tests", _BASE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config().data
  cfg.data_dir = str(data_dir)
  for key, value in overrides.items():
    setattr(cfg, key, value)
  return cfg


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("data_tfds")


@pytest.fixture(scope="session")
def stdlib_cfg(shared_dir):
  return data_config(shared_dir, name="stdlib_text")


@pytest.fixture(scope="session")
def synth_cfg(shared_dir):
  """A small synthetic dataset (~130 train windows of 65 tokens)."""
  return data_config(shared_dir, name="synthetic", synthetic_docs=5, seq_len=64)


def derive(cfg, **overrides):
  """A copy of the data config `cfg` with `overrides`."""
  new = cfg.copy_and_resolve_references()
  for key, value in overrides.items():
    setattr(new, key, value)
  return new


def rows(batches):
  """Multiset of sequences (as bytes) in a list of token arrays."""
  return collections.Counter(r.tobytes() for b in batches for r in b)


# --- tokenizer -----------------------------------------------------------


def test_tokenizer_ids_and_round_trip():
  assert (BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE) == (256, 257, 258, 259)
  text = "def f(x):\n  return 'héllo, 世界' 🙂"
  ids = data.encode(text)
  assert ids.dtype == np.int32 and ids.max() < 256
  assert list(ids) == list(text.encode("utf-8"))
  assert data.decode(ids) == text
  assert data.decode(np.concatenate([[BOS_ID], ids, [EOS_ID, PAD_ID]])) == text
  assert np.array_equal(data.encode(b"ab"), [97, 98])
  assert data.decode([0xE4, 0xB8]) == "\ufffd"  # a cut multi-byte char never raises


# --- stdlib_text ---------------------------------------------------------


def test_stdlib_builds_with_disjoint_file_splits_in_sorted_order(stdlib_cfg):
  sources = data.get_data_sources(stdlib_cfg)
  docs = {split: list(builders.stdlib_documents(split)) for split in ("train", "validation")}
  keys = {split: [k for k, _ in docs[split]] for split in docs}
  assert not set(keys["train"]) & set(keys["validation"])
  assert all("site-packages" not in k for k in keys["train"] + keys["validation"])
  files = [k for k in keys["train"] if not k.startswith("pydoc_data/topics/")]
  assert len(files) > 1000 and files == sorted(files)
  assert any(k.startswith("pydoc_data/topics/") for k in keys["train"])
  n_train, n_val = len(sources["train"]), len(sources["validation"])
  assert (n_train, n_val) == (len(docs["train"]), len(docs["validation"]))
  assert 0.02 < n_val / (n_train + n_val) < 0.09
  for split, source in sources.items():  # stored order is the documented order
    for i in (0, len(source) // 2, len(source) - 1):
      assert source[i]["text"].decode("utf-8") == docs[split][i][1]
  # The build is keyed by the interpreter, so another CPython never reuses it.
  version = "_".join(map(str, sys.version_info[:3]))
  assert builders.stdlib_config().name.startswith(f"py{version}_")


def test_stdlib_stream_is_documents_then_eos(stdlib_cfg):
  stream = data.token_stream(stdlib_cfg, "validation")
  source = data.get_data_sources(stdlib_cfg)["validation"]
  expected = np.concatenate([np.append(data.encode(source[i]["text"]), EOS_ID) for i in range(len(source))])
  assert np.array_equal(stream, expected)
  assert (stream == EOS_ID).sum() == len(source) and not (stream == BOS_ID).any()


# --- sequences and BOS policies ------------------------------------------


def test_bos_prepend_puts_bos_at_position_zero_only(stdlib_cfg):
  batch = next(data.train_iterator(stdlib_cfg, batch_size=16, seed=0))["tokens"]
  assert batch.shape == (16, stdlib_cfg.seq_len + 1) and batch.dtype == np.int32
  assert (batch[:, 0] == BOS_ID).all()
  assert not (batch[:, 1:] == BOS_ID).any() and not (batch == PAD_ID).any()


def test_bos_none_gives_consecutive_stream_windows(synth_cfg):
  cfg = derive(synth_cfg, bos="none", shuffle=False)
  stream = data.token_stream(cfg, "train").astype(np.int32)
  L, B = cfg.seq_len, 4
  it = data.train_iterator(cfg, batch_size=B, seed=0)
  for step in range(3):
    batch = next(it)["tokens"]
    for i, row in enumerate(batch):
      k = step * B + i
      assert np.array_equal(row, stream[k * L:k * L + L + 1])
  assert not (batch == BOS_ID).any() and not (batch == PAD_ID).any()
  # Same offsets as under "prepend": window k covers the same text.
  prepend = data.windows(cfg, "train", bos="prepend")
  assert len(prepend) == len(data.windows(cfg, "train")) == (len(stream) - 1) // L
  assert np.array_equal(prepend[5][1:], stream[5 * L:6 * L])


# --- order, shards, resume -----------------------------------------------


def test_order_is_a_function_of_the_seed(synth_cfg):
  take = lambda seed: [next(it)["tokens"] for it in [data.train_iterator(synth_cfg, batch_size=8, seed=seed)]
                       for _ in range(4)]
  a, b, c = take(0), take(0), take(1)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_each_epoch_is_a_fresh_permutation_of_all_windows(synth_cfg):
  source = data.windows(synth_cfg, "train")
  it = data.train_iterator(synth_cfg, batch_size=1, seed=0)
  epochs = [np.concatenate([next(it)["tokens"] for _ in range(len(source))]) for _ in range(2)]
  everything = rows([np.stack([source[k] for k in range(len(source))])])
  assert rows([epochs[0]]) == rows([epochs[1]]) == everything
  assert not np.array_equal(epochs[0], epochs[1])


def test_process_shards_are_disjoint_and_cover_the_global_batch(synth_cfg):
  n_windows, B, P = len(data.windows(synth_cfg, "train")), 4, 2
  steps = n_windows // (B * P)  # one epoch
  shards = [[next(it)["tokens"] for _ in range(steps)]
            for it in [data.train_iterator(synth_cfg, batch_size=B, seed=3, process_index=p, process_count=P)
                       for p in range(P)]]
  single = data.train_iterator(synth_cfg, batch_size=B * P, seed=3)
  for t in range(steps):
    assert rows([shards[0][t], shards[1][t]]) == rows([next(single)["tokens"]])
  seen = [rows(s) for s in shards]
  assert not seen[0] & seen[1]
  assert sum(seen[0].values()) + sum(seen[1].values()) == steps * B * P
  everything = rows([np.stack([data.windows(synth_cfg, "train")[k] for k in range(n_windows)])])
  assert not (seen[0] + seen[1]) - everything


def test_resume_from_state_continues_exactly_across_epochs(synth_cfg):
  steps_per_epoch = len(data.windows(synth_cfg, "train")) // 8
  it = data.train_iterator(synth_cfg, batch_size=8, seed=5)
  for _ in range(steps_per_epoch - 2):
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # as grain's orbax handler stores it
  expected = [next(it)["tokens"] for _ in range(6)]  # crosses into the next epoch
  resumed = data.train_iterator(synth_cfg, batch_size=8, seed=5)
  resumed.set_state(state)
  assert all(np.array_equal(x, next(resumed)["tokens"]) for x in expected)


def test_iterator_checkpoints_with_orbax(synth_cfg, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  it = data.train_iterator(synth_cfg, batch_size=4, seed=0)
  for _ in range(3):
    next(it)
  with ocp.CheckpointManager(tmp_path / "ckpt", options=ocp.CheckpointManagerOptions(
      enable_async_checkpointing=False)) as mngr:
    mngr.save(3, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
    expected = [next(it)["tokens"] for _ in range(3)]
    fresh = data.train_iterator(synth_cfg, batch_size=4, seed=0)
    restored = mngr.restore(3, args=ocp.args.Composite(data_iter=grain.checkpoint.CheckpointRestore(fresh)))
  assert all(np.array_equal(x, next(restored.data_iter)["tokens"]) for x in expected)


# --- eval sequences ------------------------------------------------------


def test_eval_sequences_are_fixed_spread_and_follow_bos(stdlib_cfg):
  a = data.eval_sequences(stdlib_cfg, num_sequences=32)
  assert a.shape == (32, stdlib_cfg.seq_len + 1) and a.dtype == np.int32
  assert np.array_equal(a, data.eval_sequences(stdlib_cfg, num_sequences=32))
  assert (a[:, 0] == BOS_ID).all() and not (a[:, 1:] == BOS_ID).any()
  none = data.eval_sequences(stdlib_cfg, num_sequences=32, bos="none")
  assert not (none == BOS_ID).any()
  assert np.array_equal(none[:, :-1], a[:, 1:])  # same text under both policies
  n = len(data.windows(stdlib_cfg, "validation"))
  stream = data.token_stream(stdlib_cfg, "validation")
  L = stdlib_cfg.seq_len
  assert np.array_equal(none[-1], stream[(31 * n // 32) * L:][:L + 1])  # spans the whole split
  with pytest.raises(ValueError, match=rf"validation split .* only {n} windows"):
    data.eval_sequences(stdlib_cfg, num_sequences=n + 1)
  train = data.eval_sequences(stdlib_cfg, num_sequences=4, split="train")
  assert not np.array_equal(train, a[:4])


def test_config_errors_name_the_field(tmp_path):
  with pytest.raises(ValueError, match=r"data\.bos .*prepend, none"):
    data.eval_sequences(data_config(tmp_path, bos="first"), num_sequences=1)
  with pytest.raises(ValueError, match=r"overriding data\.bos\) must be one of prepend, none"):
    data.eval_sequences(data_config(tmp_path), num_sequences=1, bos="sometimes")
  with pytest.raises(ValueError, match=r"data\.name='no_such_corpus_xyz' is not one of stdlib_text"):
    data.get_data_sources(data_config(tmp_path, name="no_such_corpus_xyz"))


# --- text_files ----------------------------------------------------------


def _write_corpus(root: Path) -> dict[str, str]:
  texts = {f"a{i}.txt": f"file {i}: " + "hello world. " * (20 + i) for i in range(12)}
  texts["deep/nested/b.txt"] = "nested ünïcode text\n" * 30
  texts["deep/c.md"] = "# not matched by the glob\n"
  texts["empty.txt"] = ""
  for rel, text in texts.items():
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text, encoding="utf-8")
  return texts


def test_text_files_builder_splits_by_file(tmp_path):
  corpus = tmp_path / "corpus"
  texts = _write_corpus(corpus)
  cfg = data_config(tmp_path / "tfds", name="text_files", seq_len=32,
                    files=f"{corpus}/**/*.txt, {corpus}/deep/c.md")
  sources = data.get_data_sources(cfg)
  got = {split: [s[i]["text"].decode() for i in range(len(s))] for split, s in sources.items()}
  assert len(got["validation"]) >= 1 and len(got["train"]) >= 1
  expected = sorted(t for rel, t in texts.items() if t)  # empty.txt is skipped
  assert sorted(got["train"] + got["validation"]) == expected
  assert data.eval_sequences(cfg, num_sequences=2).shape == (2, 33)
  # Another file set (or an edit) gets its own build, never a stale one.
  first = builders.text_files_config(cfg.files, 0.05).name
  assert builders.text_files_config(f"{corpus}/a1.txt,{corpus}/a2.txt", 0.05).name != first
  os.utime(corpus / "a3.txt", ns=(1, 1))
  assert builders.text_files_config(cfg.files, 0.05).name != first


def test_text_files_single_file_splits_by_bytes(tmp_path):
  path = tmp_path / "one.txt"
  text = "ünïcode line number %d\n"
  path.write_text("".join(text % i for i in range(200)), encoding="utf-8")
  sources = data.get_data_sources(data_config(tmp_path / "tfds", name="text_files", files=str(path)))
  train, val = sources["train"][0]["text"], sources["validation"][0]["text"]
  assert (len(sources["train"]), len(sources["validation"])) == (1, 1)
  assert train + val == path.read_bytes()
  assert 0.03 < len(val) / (len(train) + len(val)) < 0.07


def test_text_files_errors_name_the_problem(tmp_path):
  (tmp_path / "empty.txt").write_text("")
  (tmp_path / "nul.txt").write_bytes(b"text\0more")
  (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
  (tmp_path / "ok.txt").write_text("fine text")
  cases = {
      f"{tmp_path}/*.nothing": r"data\.files: '.*\*\.nothing' matches no file",
      f"{tmp_path}/missing.txt": r"data\.files: '.*missing\.txt' matches no file",
      f"{tmp_path}/empty.txt": r"data\.files: all 1 matched files are empty",
      f"{tmp_path}/ok.txt,{tmp_path}/nul.txt": r"data\.files: .*nul\.txt looks binary",
      f"{tmp_path}/latin1.txt": r"data\.files: .*latin1\.txt is not UTF-8",
      " , ": r"data\.files is empty",
  }
  for files, message in cases.items():
    with pytest.raises(ValueError, match=message):
      data.get_data_sources(data_config(tmp_path / "tfds", name="text_files", files=files))
  assert not list((tmp_path / "tfds").glob("text_files/*/*"))  # nothing half-built left behind


# --- synthetic -----------------------------------------------------------


def test_synthetic_generator_is_seeded():
  params = synthetic.SyntheticParams(seed=7)
  doc = lambda seed, p=params: data.generate_document(np.random.default_rng(seed), p)
  assert doc(1) == doc(1) and doc(1) != doc(2)
  assert doc(1) != doc(1, synthetic.SyntheticParams(seed=8))  # the language seed changes the lexicon
  assert re.fullmatch(r"[a-zA-Z0-9 .=?>]+", doc(1))


def test_synthetic_labels_match_the_text_and_the_statistics():
  params = synthetic.SyntheticParams()
  docs = [synthetic.generate_annotated_document(synthetic.document_rng(params, "validation", i), params)
          for i in range(100)]
  n_copy = n_bytes = n_fresh = 0
  for d in docs:
    text = np.frombuffer(d.text.encode(), np.uint8)
    copy = d.labels == synthetic.COPY
    assert (d.source[copy] < np.nonzero(copy)[0]).all() and (d.source[~copy] == -1).all()
    assert np.array_equal(text[copy], text[d.source[copy]])
    # Parse the text back independently of the labels.
    defs = {}
    recalls = echoes = copied = 0
    for m in re.finditer(r"([A-Z]+)([=?])(\d+)\. |> ([a-z ]+\. )", d.text):
      if m.group(4):
        echoes += 1
        copied += len(m.group(4))
        assert d.text[:m.start()].endswith(m.group(4))  # repeats the sentence just before
      elif m.group(2) == "=":
        defs[m.group(1)] = m.group(3)
      else:
        recalls += 1
        copied += len(m.group(3))
        assert defs[m.group(1)] == m.group(3)  # recalled value == its definition
    assert (len(defs), recalls, echoes) == (d.num_definitions, d.num_recalls, d.num_echoes)
    assert copied == copy.sum()
    n_fresh += sum(len(k) + len(v) for k, v in defs.items()) + 3 * recalls
    n_copy += copied
    n_bytes += len(d.text)
  stats = data.synthetic_statistics(params, split="validation", num_docs=100)
  assert stats["copy_fraction"] == pytest.approx(n_copy / n_bytes)
  assert stats["fresh_fraction"] == pytest.approx(n_fresh / n_bytes)
  assert stats["local_fraction"] + stats["fresh_fraction"] + stats["copy_fraction"] == pytest.approx(1.0)
  assert stats["bytes_per_doc"] == pytest.approx(n_bytes / 100)
  # Event rates follow the construction: p_echo per sentence, E[sentences] = 28.
  mean_sentences = (params.min_sentences + params.max_sentences) / 2
  assert stats["echoes_per_doc"] == pytest.approx(params.p_echo * mean_sentences, rel=0.2)
  assert stats["definitions_per_doc"] == pytest.approx(params.p_define * mean_sentences, rel=0.2)
  assert 0.05 < stats["copy_fraction"] < 0.3 and stats["local_fraction"] > 0.7
  assert 0 < stats["copy_within_context"] <= 1 and stats["mean_copy_distance"] > 0


def test_synthetic_builder_splits_are_disjoint_seeded_sets(synth_cfg):
  sources = data.get_data_sources(synth_cfg)
  params = synthetic.params_from_config(synth_cfg)
  got = {s: [src[i]["text"].decode() for i in range(len(src))] for s, src in sources.items()}
  assert got["train"] == list(synthetic.split_documents(params, "train", 5))
  assert got["validation"] == list(synthetic.split_documents(params, "validation", 10))  # max(10, 5 // 10)
  assert not set(got["train"]) & set(got["validation"])


# --- catalog datasets and concurrency ------------------------------------


class AbsposTestCatalog(tfds.core.GeneratorBasedBuilder):
  """Stands in for a TFDS catalog dataset: train/test splits, text in `content`."""

  VERSION = tfds.core.Version("1.0.0")
  code_path = None  # see builders._TextBuilder

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
        {"content": tfds.features.Text(), "label": tfds.features.Scalar(np.int64)}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(50), "test": self._generate_examples(10)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {"content": f"catalog document {i} " * 20, "label": i}


def test_catalog_dataset_by_name_offline(tmp_path):
  with pytest.raises(ValueError, match=r"data\.name='abspos_test_catalog'.* not prepared .*tfds build abspos_test_catalog"):
    data.get_data_sources(data_config(tmp_path, name="abspos_test_catalog"))
  AbsposTestCatalog(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  with pytest.raises(ValueError, match=r"data\.text_key='text' .*\['content', 'label'\]"):
    data.get_data_sources(data_config(tmp_path, name="abspos_test_catalog"))
  cfg = data_config(tmp_path, name="abspos_test_catalog", text_key="content", seq_len=32)
  sources = data.get_data_sources(cfg)
  assert (len(sources["train"]), len(sources["validation"])) == (50, 10)  # validation falls back to test
  tokens = data.eval_sequences(cfg, num_sequences=4)
  assert re.match(r"catalog document \d+ catalog", data.decode(tokens[0]))


_BUILD_SCRIPT = """
import json, sys, time
from pathlib import Path
import ml_collections
from abspos_jax import data
cfg, me = ml_collections.ConfigDict(json.loads(sys.argv[1])), Path(sys.argv[2])
me.with_suffix(".ready").touch()
while not (me.parent / "go").exists():  # start both builds at the same moment
  time.sleep(0.01)
print(json.dumps({split: len(s) for split, s in data.get_data_sources(cfg).items()}))
"""


def test_concurrent_builds_do_not_collide(tmp_path):
  cfg = data_config(tmp_path / "tfds", name="synthetic", synthetic_docs=300, synthetic_seed=11)
  env = {**os.environ, "PYTHONPATH": str(_BASE.parents[1])}
  procs = [subprocess.Popen([sys.executable, "-c", _BUILD_SCRIPT, cfg.to_json(), str(tmp_path / f"p{i}")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for i in range(2)]
  deadline = time.time() + 60
  while not all((tmp_path / f"p{i}.ready").exists() for i in range(2)) and time.time() < deadline:
    time.sleep(0.01)
  (tmp_path / "go").touch()
  outputs = [p.communicate(timeout=60) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
  assert [json.loads(out) for out, _ in outputs] == [{"train": 300, "validation": 30}] * 2
  built = tmp_path / "tfds" / "synthetic"
  assert not [p for p in built.rglob("*") if "incomplete" in p.name.lower()]
  assert len(list(built.glob("*/1.0.0/dataset_info.json"))) == 1
