"""TFDS builders for the project's text datasets, and where data sources come from.

Five builders, each with a single ``text`` feature stored as ArrayRecord (so
they are read with ``as_data_source`` and grain, no TensorFlow needed):

- ``stdlib_text``: the offline default, the ``*.py`` sources of the running
  CPython's standard library plus the ``pydoc_data`` documentation topics.
- ``stdlib_prose``: the ``pydoc_data`` topics alone (English prose, ~465 kB):
  natural language that ships with every CPython, for analysing pretrained LMs.
- ``text_files``: the user's own files (``data.files``).
- ``synthetic``: the seeded language of ``abspos_jax.data.synthetic``.
- ``backcopy``: the seeded Bigram-Backcopy language of ``abspos_jax.data.backcopy``.

Validation is split by file, never inside a file: ``validation_hash`` of a
file's relative path puts it in ``validation`` when below the fraction.

Any other ``data.name`` is looked up as an already prepared TFDS catalog
dataset; nothing is ever downloaded.
"""

import contextlib
import dataclasses
import fcntl
import glob
import hashlib
import logging
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tensorflow_datasets as tfds

from abspos_jax.data import backcopy, synthetic

BUILTIN_NAMES = ("stdlib_text", "stdlib_prose", "text_files", "synthetic", "backcopy")
STDLIB_VALIDATION_FRACTION = 0.05
_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})

# Builds print progress bars; one process-wide switch keeps logs readable.
tfds.disable_progress_bar()


def validation_hash(key: str) -> float:
  """A deterministic number in [0, 1) for `key` (a relative path): the split rule."""
  return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64


def _fingerprint(obj: Any) -> str:
  return hashlib.sha256(repr(obj).encode("utf-8")).hexdigest()[:16]


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
  """Exclusive advisory lock (fcntl) on `path`, held for the `with` body.

  Serialises concurrent builds of the same dataset across processes.
  """
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


class _DropExpectedTfdsWarnings(logging.Filter):
  """Drops TFDS warnings that every build or reuse of our builders triggers."""

  _EXPECTED = (
      "Using custom data configuration",  # our configs are made per data config
      "Variant folder",  # "... has no dataset_info.json": checked before the first build
  )

  def filter(self, record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(self._EXPECTED)


@contextlib.contextmanager
def _quiet_tfds() -> Iterator[None]:
  noise = _DropExpectedTfdsWarnings()
  logger = logging.getLogger("absl")
  logger.addFilter(noise)
  try:
    yield
  finally:
    logger.removeFilter(noise)


def resolve_data_dir(data_cfg: Any) -> Path:
  """`data.data_dir`, else `$ABSPOS_DATA_DIR`, else `~/.cache/abspos_jax/tfds`."""
  root = data_cfg.data_dir or os.environ.get("ABSPOS_DATA_DIR") or "~/.cache/abspos_jax/tfds"
  return Path(root).expanduser().resolve()


class _TextBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared by our builders: one `text` feature, examples kept in generation order."""

  VERSION = tfds.core.Version("1.0.0")
  # TFDS looks for a checksums file beside the builder's module; we download
  # nothing, and its lookup for modules inside a package needs the
  # importlib_resources backport, which we do not depend on.
  code_path = None

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.__doc__,
        features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
        # Keep the documented order (e.g. sorted paths) instead of TFDS's
        # shuffle-by-key-hash, so documents stay contiguous and inspectable.
        disable_shuffling=True,
    )

  # TFDS prints a banner to stdout before and after every build; log instead.
  def _log_download_bytes(self) -> None:
    logging.info("Preparing %s in %s", self.info.full_name, self.data_dir)

  def _log_download_done(self) -> None:
    logging.info("Prepared %s in %s", self.info.full_name, self.data_dir)


# --- stdlib_text -----------------------------------------------------------


def _stdlib_root() -> Path:
  return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_paths() -> list[str]:
  """Sorted POSIX paths, relative to the stdlib root, of its `*.py` files."""
  root = _stdlib_root()
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]
    rel_dir = Path(dirpath).relative_to(root)
    paths.extend((rel_dir / f).as_posix() for f in filenames if f.endswith(".py"))
  return sorted(paths)


def stdlib_documents(split: str, code: bool = True) -> Iterator[tuple[str, str]]:
  """`(key, text)` of the stdlib_text examples of `split`, in stored order.

  Files come first (sorted relative paths, empty or non-UTF-8 ones skipped),
  then the `pydoc_data` topics (sorted, key `pydoc_data/topics/<topic>`). An
  example is in `validation` iff `validation_hash(key) < 0.05`. `code=False`
  gives the topics alone (stdlib_prose).
  """
  from pydoc_data.topics import topics  # pylint: disable=g-import-not-at-top

  want_validation = split == "validation"
  root = _stdlib_root()
  for rel in _stdlib_paths() if code else []:
    if (validation_hash(rel) < STDLIB_VALIDATION_FRACTION) != want_validation:
      continue
    try:
      text = (root / rel).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
      continue  # e.g. the test suite's deliberately mis-encoded files
    if text:
      yield rel, text
  for topic in sorted(topics):
    key = f"pydoc_data/topics/{topic}"
    if (validation_hash(key) < STDLIB_VALIDATION_FRACTION) == want_validation and topics[topic]:
      yield key, topics[topic]


def stdlib_config() -> tfds.core.BuilderConfig:
  """Config named by the CPython version and a hash of the stdlib file list.

  A different interpreter (or a patched stdlib) gets its own data dir instead
  of silently reusing another's build.
  """
  root = _stdlib_root()
  listing = [(rel, (root / rel).stat().st_size) for rel in _stdlib_paths()]
  version = "_".join(str(v) for v in sys.version_info[:3])
  return tfds.core.BuilderConfig(
      name=f"py{version}_{_fingerprint((sys.version, listing))}",
      description=f"Python {sys.version.split()[0]} stdlib at {root}",
  )


class StdlibText(_TextBuilder):
  """The running CPython's standard library `*.py` sources and pydoc topics."""

  CODE = True

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split) for split in ("train", "validation")}

  def _generate_examples(self, split):
    for key, text in stdlib_documents(split, code=self.CODE):
      yield key, {"text": text}


class StdlibProse(StdlibText):
  """The running CPython's pydoc topics: English prose (the validation split is a few topics)."""

  CODE = False


# --- text_files ------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class TextFilesConfig(tfds.core.BuilderConfig):
  """The resolved files (absolute paths, sorted) and the validation share."""

  files: tuple[str, ...] = ()
  validation_fraction: float = 0.05


def resolve_files(spec: str) -> list[Path]:
  """Files named by `data.files`: comma-separated paths or globs (`**` recursive).

  Raises:
    ValueError: naming `data.files` and the path or glob that matches no file.
  """
  patterns = [p.strip() for p in spec.split(",") if p.strip()]
  if not patterns:
    raise ValueError("data.files is empty: text_files needs --config.data.files=PATH[,GLOB...]")
  found: set[Path] = set()
  for pattern in patterns:
    expanded = os.path.expanduser(pattern)
    matches = [Path(m) for m in glob.glob(expanded, recursive=True)] if glob.has_magic(expanded) else [Path(expanded)]
    files = [m.resolve() for m in matches if m.is_file()]
    if not files:
      hint = " (it is a directory; use e.g. DIR/**/*.txt)" if Path(expanded).is_dir() else ""
      raise ValueError(f"data.files: {pattern!r} matches no file{hint}")
    found.update(files)
  return sorted(found)


def text_files_config(spec: str, validation_fraction: float) -> TextFilesConfig:
  """Config whose name hashes the resolved files, their sizes and mtimes.

  So a different (or edited) file set never reuses another's build.
  """
  if not 0.0 < validation_fraction < 1.0:
    raise ValueError(f"data.validation_fraction must be in (0, 1), got {validation_fraction}")
  files = resolve_files(spec)
  stats = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
  return TextFilesConfig(
      name=f"files_{_fingerprint((stats, validation_fraction))}",
      description=f"data.files={spec!r}: {len(files)} files",
      files=tuple(str(p) for p in files),
      validation_fraction=validation_fraction,
  )


def _check_text_file(path: Path) -> bytes:
  data = path.read_bytes()
  if b"\0" in data:
    raise ValueError(f"data.files: {path} looks binary (contains NUL bytes); text_files takes UTF-8 text")
  try:
    data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"data.files: {path} is not UTF-8 text ({e})") from None
  return data


def _utf8_boundary(data: bytes, cut: int) -> int:
  # Move forward past continuation bytes (0b10xxxxxx) so both halves decode.
  while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
    cut += 1
  return cut


def text_files_plan(files: tuple[str, ...], validation_fraction: float) -> dict[str, list[tuple[str, str, int, int]]]:
  """Which file (and byte range) goes to which split.

  Files are keyed by their path relative to the files' common directory;
  `validation_hash(key) < validation_fraction` puts a file in validation, with
  at least one validation and one train file when there are >= 2 non-empty
  files. A single non-empty file is split by bytes instead: the last
  `validation_fraction` of it is validation. Empty files are skipped.

  Returns:
    `{"train": [...], "validation": [...]}` of `(key, path, start, stop)`.

  Raises:
    ValueError: a binary or non-UTF-8 file, or every file empty.
  """
  sizes = {path: len(_check_text_file(Path(path))) for path in files}
  nonempty = [p for p in files if sizes[p] > 0]
  if not nonempty:
    raise ValueError(f"data.files: all {len(files)} matched files are empty: {list(files)}")
  if len(nonempty) == 1:
    path = nonempty[0]
    data = Path(path).read_bytes()
    cut = _utf8_boundary(data, max(1, min(len(data) - 1, round(len(data) * (1 - validation_fraction)))))
    key = Path(path).name
    return {"train": [(key, path, 0, cut)], "validation": [(key, path, cut, len(data))]}
  common = os.path.commonpath(nonempty)
  keyed = sorted((validation_hash(os.path.relpath(p, common)), os.path.relpath(p, common), p) for p in nonempty)
  n_val = sum(h < validation_fraction for h, _, _ in keyed)
  n_val = min(max(n_val, 1), len(keyed) - 1)  # the lowest hashes are validation
  entry = lambda item: (item[1], item[2], 0, sizes[item[2]])
  return {
      "train": sorted(entry(k) for k in keyed[n_val:]),
      "validation": sorted(entry(k) for k in keyed[:n_val]),
  }


class TextFiles(_TextBuilder):
  """The user's own UTF-8 text files (`data.files`), one example per file."""

  def _split_generators(self, dl_manager):
    del dl_manager
    plan = text_files_plan(self.builder_config.files, self.builder_config.validation_fraction)
    return {split: self._generate_examples(entries) for split, entries in plan.items()}

  def _generate_examples(self, entries):
    for key, path, start, stop in entries:
      yield key, {"text": Path(path).read_bytes()[start:stop].decode("utf-8")}


# --- synthetic and backcopy -----------------------------------------------


@dataclasses.dataclass(eq=False)
class SyntheticConfig(tfds.core.BuilderConfig):
  """Language params (`SyntheticParams` or `BackcopyParams`) and the number of train documents."""

  params: Any = synthetic.SyntheticParams()
  train_docs: int = 2000

  @property
  def num_docs(self) -> dict[str, int]:
    return {"train": self.train_docs, "validation": max(10, self.train_docs // 10)}


def synthetic_config(data_cfg: Any) -> SyntheticConfig:
  """Config of `data.name` synthetic or backcopy, named by seed, size and a hash of all language params.

  So a changed knob gets its own build, never a stale one.
  """
  language = backcopy if data_cfg.name == "backcopy" else synthetic
  params = language.params_from_config(data_cfg)
  docs = int(data_cfg.synthetic_docs)
  if docs < 1:
    raise ValueError(f"data.synthetic_docs must be >= 1, got {docs}")
  return SyntheticConfig(
      name=f"seed{params.seed}_docs{docs}_{_fingerprint(params)}",
      description=f"{data_cfg.name} language {params}",
      params=params,
      train_docs=docs,
  )


class Synthetic(_TextBuilder):
  """Documents of the seeded synthetic language (abspos_jax.data.synthetic)."""

  language = synthetic  # the module whose `split_documents` generates the text

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split, n) for split, n in self.builder_config.num_docs.items()}

  def _generate_examples(self, split, num_docs):
    docs = self.language.split_documents(self.builder_config.params, split, num_docs)
    for i, text in enumerate(docs):
      yield f"{split}/{i:08d}", {"text": text}


class Backcopy(Synthetic):
  """Documents of the seeded Bigram-Backcopy language (abspos_jax.data.backcopy)."""

  language = backcopy


# --- data sources ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PreparedDataset:
  """A prepared TFDS dataset and how our two splits map onto its splits.

  Attributes:
    builder: the TFDS builder, `is_prepared()` true.
    splits: `{"train": name, "validation": name}` of TFDS split names.
    text_key: the feature holding the text.
    data_dir: the resolved data dir (the token cache lives under it).
  """

  builder: tfds.core.DatasetBuilder
  splits: dict[str, str]
  text_key: str
  data_dir: Path

  def source(self, split: str):
    """The random-access data source of our `split` ("train" or "validation")."""
    return self.builder.as_data_source(split=self.splits[split])


def _builtin_builder(data_cfg: Any, data_dir: Path) -> tfds.core.DatasetBuilder:
  if data_cfg.name in ("stdlib_text", "stdlib_prose"):
    cls, config = (StdlibText if data_cfg.name == "stdlib_text" else StdlibProse), stdlib_config()
  elif data_cfg.name == "text_files":
    cls, config = TextFiles, text_files_config(data_cfg.files, float(data_cfg.validation_fraction))
  else:
    cls, config = (Backcopy if data_cfg.name == "backcopy" else Synthetic), synthetic_config(data_cfg)
  make = lambda: cls(config=config, data_dir=os.fspath(data_dir), file_format="array_record")
  with _quiet_tfds():
    builder = make()
    if not builder.is_prepared():
      # TFDS writes into a temporary dir and renames it at the end, but two
      # concurrent builds would race on that rename; whoever waits on the lock
      # finds the dataset prepared and just reads it.
      with file_lock(data_dir / ".locks" / f"{cls.name}-{config.name}.lock"):
        builder = make()
        if not builder.is_prepared():
          builder.download_and_prepare()
          builder = make()  # re-read the written dataset_info (split sizes)
  return builder


def _catalog_builder(data_cfg: Any, data_dir: Path) -> PreparedDataset:
  name = data_cfg.name
  how = (f"prepare it where there is network with `tfds build {name} --data_dir=DIR"
         f" --file_format=array_record`, then copy DIR's contents to {data_dir}"
         " (or point --config.data.data_dir at DIR)")
  try:
    builder = tfds.builder(name, data_dir=os.fspath(data_dir), try_gcs=False)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
        f"data.name={name!r} is not one of {', '.join(BUILTIN_NAMES)} and no TFDS"
        f" dataset of that name is known or prepared in {data_dir}; to use a TFDS"
        f" catalog dataset, {how}") from None
  if not builder.is_prepared():
    raise ValueError(f"data.name={name!r}: the TFDS dataset is not prepared in {data_dir} and"
                     f" nothing is downloaded here; {how}")
  info = builder.info
  if not info.available_file_formats() & set(tfds.core.file_adapters.FileFormat.with_random_access()):
    raise ValueError(f"data.name={name!r} is prepared as {info.file_format.value}, but random access"
                     f" needs array_record; rebuild: `tfds build {name} --file_format=array_record`")
  available = sorted(info.splits.keys())
  if "train" not in available:
    raise ValueError(f"data.name={name!r} has no 'train' split; available splits: {available}")
  validation = next((s for s in ("validation", "test") if s in available), None)
  if validation is None:
    raise ValueError(f"data.name={name!r} has neither a 'validation' nor a 'test' split for"
                     f" held-out data; available splits: {available}")
  features = list(info.features.keys())
  if data_cfg.text_key not in features:
    raise ValueError(f"data.text_key={data_cfg.text_key!r} is not a feature of {name!r};"
                     f" its features: {features}")
  return PreparedDataset(builder, {"train": "train", "validation": validation}, data_cfg.text_key, data_dir)


def prepare_dataset(data_cfg: Any) -> PreparedDataset:
  """Builds our named dataset if needed (idempotent, process-safe) or opens a
  prepared TFDS catalog dataset. Never downloads.

  Raises:
    ValueError: bad `data.*` fields, or a catalog dataset that is unknown,
      unprepared, not ArrayRecord, lacks the splits or the text feature.
  """
  if not isinstance(data_cfg.name, str) or not data_cfg.name:
    raise ValueError(f"data.name must be one of {', '.join(BUILTIN_NAMES)} or the name of a"
                     f" prepared TFDS dataset, got {data_cfg.name!r}")
  data_dir = resolve_data_dir(data_cfg)
  data_dir.mkdir(parents=True, exist_ok=True)
  if data_cfg.name in BUILTIN_NAMES:
    builder = _builtin_builder(data_cfg, data_dir)
    return PreparedDataset(builder, {"train": "train", "validation": "validation"}, "text", data_dir)
  return _catalog_builder(data_cfg, data_dir)


def get_data_sources(data_cfg: Any) -> dict[str, Any]:
  """`{"train": source, "validation": source}` of random-access TFDS sources.

  Each source is indexable (`len`, `source[i] -> {"text": bytes, ...}`).
  """
  prepared = prepare_dataset(data_cfg)
  return {split: prepared.source(split) for split in ("train", "validation")}
