"""Base config: every field the project knows, with defaults that work offline.

Other configs start from this one and change a few fields. Any field can be
overridden on the command line, e.g. ``--config.model.num_layers=6``.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()

  c.model = m = ml_collections.ConfigDict()
  m.position = "rope"  # rope | ntk | swa | nope | learned
  m.num_layers = 4
  m.d_model = 128
  m.num_heads = 4
  m.num_kv_heads = 0  # key/value heads (grouped-query attention); must divide num_heads; 0: num_heads
  m.qkv_bias = False  # biases on the q, k and v projections (Qwen2-style checkpoints)
  m.mlp_dim = 0  # 0: SwiGLU hidden size 8/3 * d_model rounded up to a multiple of 64
  m.vocab_size = 259  # byte-level: 256 bytes + BOS, EOS, PAD
  m.max_len = 0  # positions a `learned` model embeds; 0: data.seq_len
  m.rope_base = 10000.0
  m.ntk_alpha = 8.0  # ntk only: base = rope_base * ntk_alpha ** (d_h / (d_h - 2))
  m.window = 32  # swa only: keys visible to a query, the query included
  m.layer_pattern = ""  # swa only: e.g. "LLG" repeated over layers (L local, G global); "" all local
  m.tie_embeddings = True
  m.norm_eps = 1e-6
  m.init_std = 0.02
  m.dtype = "float32"  # matmul input dtype: float32 | bfloat16 (float32 accumulation and activations; abspos_jax/precision.py)
  m.param_dtype = "float32"
  m.attention_impl = "xla"  # training path: xla (explicit softmax, hand-written backward) | fused (jax.nn.dot_product_attention)

  c.data = d = ml_collections.ConfigDict()
  d.name = "stdlib_text"  # stdlib_text | text_files | synthetic | backcopy | any prepared TFDS dataset
  d.data_dir = ""  # "": $ABSPOS_DATA_DIR or ~/.cache/abspos_jax/tfds
  d.seq_len = 128
  d.bos = "prepend"  # prepend | none
  d.text_key = "text"  # feature holding the text in a TFDS catalog dataset
  d.files = ""  # text_files only: comma-separated paths or globs
  d.validation_fraction = 0.05  # text_files only: share of files held out, by file
  d.synthetic_seed = 0  # synthetic and backcopy: the language's seed
  d.synthetic_docs = 2000  # synthetic and backcopy: documents per train split (validation: max(10, docs // 10))
  # synthetic only: the language's knobs (see abspos_jax/data/synthetic.py).
  d.synthetic_vocab = 256  # words in the seeded lexicon
  d.synthetic_p_define = 0.25  # per sentence: chance of a new KEY=VAL definition
  d.synthetic_p_recall = 0.25  # per sentence: chance of a KEY?VAL recall of a recent definition
  d.synthetic_p_echo = 0.15  # per sentence: chance the sentence is repeated verbatim after "> "
  # backcopy only: the Bigram-Backcopy language (see abspos_jax/data/backcopy.py).
  d.backcopy_symbols = 36  # normal symbols (a-z, 0-9, then punctuation), 2..62
  d.backcopy_triggers = 4  # trigger bytes (A, B, ...), 1..26
  d.backcopy_p_trigger = 0.1  # per step: chance of trigger + copy of the byte before it, in [0, 1]
  d.backcopy_branching = 4  # successors per symbol, 1..backcopy_symbols
  d.backcopy_mean_len = 512.0  # expected bytes per document (the end is memoryless), >= 1
  d.backcopy_zipf = 1.1  # unigram exponent: symbol r has weight (r + 1) ** -zipf, >= 0
  d.shuffle = True
  d.eval_sequences = 64  # held-out sequences scored at each evaluation

  c.train = t = ml_collections.ConfigDict()
  t.steps = 1000
  t.batch_size = 32  # global batch, in sequences
  t.grad_accum = 1  # micro-batches per step; batch_size must divide by it
  t.seed = 0
  t.learning_rate = 3e-3
  t.warmup_steps = 100
  t.end_lr_fraction = 0.1  # cosine decays to learning_rate * end_lr_fraction
  t.weight_decay = 0.1
  t.beta1 = 0.9
  t.beta2 = 0.95
  t.grad_clip = 1.0
  t.log_every = 10
  t.eval_every = 200
  # At every evaluation: sink rates, position-0 norm ratios and pooled leakage of a fixed
  # validation batch (abspos_jax/analysis/emergence_hook.py, docs/emergence.md); False turns it off.
  t.emergence = True
  t.emergence_sequences = 16  # validation sequences the emergence metrics read (>= 2)
  t.peak_flops = 0.0  # per-device peak FLOP/s for MFU; 0: a measured matmul peak of this device
  t.progress = True
  t.nonfinite = "stop"  # a NaN/Inf loss or gradient: stop (naming the step) | skip (drop that batch, go on)
  t.stop_at_step = 0  # > 0: checkpoint and exit after this step (time-sliced jobs); rerun to go on

  c.checkpoint = k = ml_collections.ConfigDict()
  k.every = 200
  k.keep = 3  # the latest checkpoints kept
  k.keep_period = 0  # > 0: also keep every checkpoint whose step is a multiple of it (a multiple of every)
  k.async_save = True

  c.mesh = s = ml_collections.ConfigDict()
  s.shape = (-1,)  # -1: all remaining devices
  s.axes = ("data",)  # names from: data, fsdp, tensor
  # Logical parameter axis -> mesh axes. Data-parallel activations shard
  # their batch over (data, fsdp); parameters shard over fsdp and tensor.
  s.rules = (
      ("batch", ("data", "fsdp")),
      ("vocab", "tensor"),
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("kv_heads", "tensor"),
      ("head_dim", None),
      ("mlp", "tensor"),
      ("norm", None),
      ("positions", None),
  )

  c.distributed = x = ml_collections.ConfigDict()
  x.enabled = False  # True: join a multi-process run (see abspos_jax/distributed.py); also implied by JAX_NUM_PROCESSES
  x.coordinator_address = ""  # "": $JAX_COORDINATOR_ADDRESS or JAX's cluster detection
  x.num_processes = 0  # 0: $JAX_NUM_PROCESSES or detected
  x.process_id = -1  # -1: $JAX_PROCESS_ID or detected
  return c
