"""Base config: every field the project knows, each declared once, with defaults that work offline.

A field's declaration holds its default, its doc line, the checks of its own
value (``choices``, ``at_least``, ``above``; a bool default admits only
True/False), whether a resumed run may change it (``resumable``: it changes
how a run is observed or laid out, not what it computes) and whether README
lists it (``key``). Checks that involve several fields are in
``abspos_jax/config.py::validate``. Other configs start from this one and
change a few fields; any field can be overridden on the command line, e.g.
``--config.model.num_layers=6``. docs/config.md lists every field.
"""

from abspos_jax.config import ATTENTION_IMPLS, BOS_POLICIES, DTYPES, NONFINITE_POLICIES, POSITIONS, build
from abspos_jax.config import Field as F

FIELDS = (
    # model
    F("model.position", "rope", "how position enters attention", choices=POSITIONS, key=True),
    F("model.num_layers", 4, "decoder blocks", at_least=1, key=True),
    F("model.d_model", 128, "residual-stream width", at_least=1, key=True),
    F("model.num_heads", 4, "attention heads; must divide d_model", at_least=1, key=True),
    F("model.num_kv_heads", 0, "key/value heads (grouped-query attention); must divide num_heads; 0: num_heads"),
    F("model.qkv_bias", False, "biases on the q, k and v projections (Qwen2-style checkpoints)"),
    F("model.mlp_dim", 0, "0: SwiGLU hidden size 8/3 * d_model rounded up to a multiple of 64", at_least=0,
      why="0: derived"),
    F("model.vocab_size", 259, "byte-level: 256 bytes + BOS, EOS, PAD", at_least=1),
    F("model.max_len", 0, "positions a `learned` model embeds; 0: data.seq_len", at_least=0, why="0: derived"),
    F("model.rope_base", 10000.0, "RoPE base (rope, ntk, swa)", above=0, key=True),
    F("model.ntk_alpha", 8.0, "ntk only: base = rope_base * ntk_alpha ** (d_h / (d_h - 2))", above=0, key=True),
    F("model.window", 32, "swa only: keys visible to a query, the query included", at_least=1,
      why="keys visible to a query, the query included", key=True),
    F("model.layer_pattern", "", 'swa only: e.g. "LLG" repeated over layers (L local, G global); "" all local',
      key=True),
    F("model.tie_embeddings", True, "the unembedding is the embedding, transposed", key=True),
    F("model.norm_eps", 1e-6, "RMSNorm epsilon", above=0),
    F("model.init_std", 0.02, "standard deviation of the initial weights"),
    F("model.dtype", "float32", "matmul input dtype (float32 accumulation and activations; abspos_jax/precision.py)",
      choices=DTYPES),
    F("model.param_dtype", "float32", "parameter dtype", choices=DTYPES),
    F("model.attention_impl", "xla", "training attention kernel: xla (explicit softmax, hand-written backward) | "
      "cudnn (cuDNN flash, NVIDIA GPU, bf16) | splash (Pallas, TPU) | fused (jax.nn.dot_product_attention, JAX "
      "picks) | auto (cudnn or splash where it applies, else xla); the analysis always runs xla "
      "(abspos_jax/attention_kernels.py)", choices=ATTENTION_IMPLS, key=True, resumable=True),
    # data
    F("data.name", "stdlib_text",
      "stdlib_text | stdlib_prose | text_files | synthetic | backcopy | any prepared TFDS dataset", key=True),
    F("data.data_dir", "", '"": $ABSPOS_DATA_DIR or ~/.cache/abspos_jax/tfds', resumable=True),
    F("data.seq_len", 128, "tokens per sequence, BOS included", at_least=2, key=True),
    F("data.bos", "prepend", "BOS at position 0 of every sequence, or none", choices=BOS_POLICIES, key=True),
    F("data.text_key", "text", "feature holding the text in a TFDS catalog dataset"),
    F("data.files", "", "text_files only: comma-separated paths or globs"),
    F("data.validation_fraction", 0.05, "text_files only: share of files held out, by file"),
    F("data.synthetic_seed", 0, "synthetic and backcopy: the language's seed"),
    F("data.synthetic_docs", 2000, "synthetic and backcopy: documents per train split (validation: max(10, docs // 10))"),
    F("data.synthetic_vocab", 256, "synthetic only (abspos_jax/data/synthetic.py): words in the seeded lexicon"),
    F("data.synthetic_p_define", 0.25, "synthetic only: per sentence, chance of a new KEY=VAL definition"),
    F("data.synthetic_p_recall", 0.25, "synthetic only: per sentence, chance of a KEY?VAL recall of a recent definition"),
    F("data.synthetic_p_echo", 0.15, 'synthetic only: per sentence, chance the sentence is repeated verbatim after "> "'),
    F("data.backcopy_symbols", 36, "backcopy only (abspos_jax/data/backcopy.py): normal symbols (a-z, 0-9, then "
      "punctuation), 2..62"),
    F("data.backcopy_triggers", 4, "backcopy only: trigger bytes (A, B, ...), 1..26"),
    F("data.backcopy_p_trigger", 0.1, "backcopy only: per step, chance of trigger + copy of the byte before it, in [0, 1]"),
    F("data.backcopy_branching", 4, "backcopy only: successors per symbol, 1..backcopy_symbols"),
    F("data.backcopy_mean_len", 512.0, "backcopy only: expected bytes per document (the end is memoryless), >= 1"),
    F("data.backcopy_zipf", 1.1, "backcopy only: unigram exponent, symbol r has weight (r + 1) ** -zipf, >= 0"),
    F("data.shuffle", True, "shuffle the training windows"),
    F("data.eval_sequences", 64, "held-out sequences scored at each evaluation"),
    # train
    F("train.steps", 1000, "optimizer steps", at_least=1, key=True),
    F("train.batch_size", 32, "global batch, in sequences", at_least=1, key=True),
    F("train.loss_chunk", 0, "> 0: the cross-entropy takes the output head this many tokens at a time, so the "
      "[B*T, V] float32 logits are never written at once (forward or backward); 0: all tokens at once",
      at_least=0, resumable=True),
    F("train.grad_accum", 1, "micro-batches per step; batch_size must divide by it", at_least=1, key=True),
    F("train.seed", 0, "initialisation and data order, in [0, 2**32)", key=True),
    F("train.learning_rate", 3e-3, "peak learning rate", above=0, key=True),
    F("train.warmup_steps", 100, "linear warmup steps", at_least=0),
    F("train.end_lr_fraction", 0.1, "cosine decays to learning_rate * end_lr_fraction"),
    F("train.weight_decay", 0.1, "AdamW decoupled weight decay, on matrices only (ndim >= 2)"),
    F("train.beta1", 0.9, "AdamW beta1"),
    F("train.beta2", 0.95, "AdamW beta2"),
    F("train.grad_clip", 1.0, "global gradient-norm clip"),
    F("train.log_every", 10, "steps between metrics records", at_least=1, resumable=True, key=True),
    F("train.eval_every", 200, "steps between evaluations (validation loss, emergence metrics)", at_least=1,
      resumable=True, key=True),
    F("train.emergence", True, "at every evaluation: sink rates, position-0 norm ratios and pooled leakage of a fixed "
      "validation batch (abspos_jax/analysis/emergence.py, docs/emergence.md)", resumable=True, key=True),
    F("train.emergence_sequences", 16, "validation sequences the emergence metrics read", at_least=2,
      why="the held-out leakage needs two halves", resumable=True, key=True),
    F("train.peak_flops", 0.0, "per-device peak FLOP/s for MFU; 0: a measured matmul peak of this device",
      resumable=True),
    F("train.progress", True, "a progress bar", resumable=True),
    F("train.nonfinite", "stop", "a NaN/Inf loss or gradient: stop (naming the step) | skip (drop that batch, go on)",
      choices=NONFINITE_POLICIES, resumable=True),
    F("train.stop_at_step", 0, "> 0: checkpoint and exit after this step (time-sliced jobs); rerun to go on",
      resumable=True),
    # checkpoint
    F("checkpoint.every", 200, "steps between checkpoints", at_least=1, resumable=True, key=True),
    F("checkpoint.keep", 3, "the latest checkpoints kept", at_least=1, resumable=True, key=True),
    F("checkpoint.keep_period", 0, "> 0: also keep every checkpoint whose step is a multiple of it (a multiple of "
      "every)", resumable=True, key=True),
    F("checkpoint.async_save", True, "save in the background while training goes on", resumable=True),
    # mesh
    F("mesh.shape", (-1,), "size per mesh axis; -1: all remaining devices", resumable=True, key=True),
    F("mesh.axes", ("data",), "names from: data, fsdp, tensor", resumable=True, key=True),
    # Logical parameter axis -> mesh axes. Data-parallel activations shard
    # their batch over (data, fsdp); parameters shard over fsdp and tensor.
    F("mesh.rules", (
        ("batch", ("data", "fsdp")),
        ("vocab", "tensor"),
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("kv_heads", "tensor"),
        ("head_dim", None),
        ("mlp", "tensor"),
        ("norm", None),
        ("positions", None),
    ), "logical axis -> mesh axes (maxtext-style sharding rules)", resumable=True, key=True),
    # distributed
    F("distributed.enabled", False, "join a multi-process run (abspos_jax/distributed.py); also implied by "
      "JAX_NUM_PROCESSES", resumable=True),
    F("distributed.coordinator_address", "", '"": $JAX_COORDINATOR_ADDRESS or JAX\'s cluster detection',
      resumable=True),
    F("distributed.num_processes", 0, "0: $JAX_NUM_PROCESSES or detected", resumable=True),
    F("distributed.process_id", -1, "-1: $JAX_PROCESS_ID or detected", resumable=True),
)


def get_config():
  return build(FIELDS)
