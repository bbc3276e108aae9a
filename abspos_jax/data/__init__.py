"""Data: byte tokenizer, TFDS builders, the synthetic languages, grain pipeline."""

from abspos_jax.data.backcopy import (
    BackcopyParams,
    backcopy_statistics,
)
from abspos_jax.data.builders import (
    BUILTIN_NAMES,
    get_data_sources,
    prepare_dataset,
    resolve_data_dir,
)
from abspos_jax.data.pipeline import (
    eval_sequences,
    token_stream,
    train_iterator,
    validate_data_config,
    windows,
)
from abspos_jax.data.synthetic import (
    SyntheticParams,
    generate_document,
    synthetic_statistics,
)
from abspos_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, decode, encode
