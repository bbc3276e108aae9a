r"""Export a trained run as a Hugging Face checkpoint.

    python -m abspos_jax.export_hf --workdir=runs/rope [--step=N] --out=runs/rope/hf

Writes ``config.json``, ``model.safetensors`` and (byte-level runs) a
``tokenizer.json`` that ``transformers.AutoModelForCausalLM.from_pretrained``
and ``AutoTokenizer.from_pretrained`` load: ``rope`` and ``ntk`` as Llama (the
NTK base as ``rope_theta``), ``swa`` as Mistral (``sliding_window``), q/k/v
biases or a local/global layer pattern as Qwen2. ``nope`` and ``learned`` are
refused with the reason. See docs/interop.md. Needs the ``.[hf]`` extra.
"""

import sys

from absl import app, flags, logging

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by train.py.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_OUT = flags.DEFINE_string("out", None, "Output directory for the Hugging Face checkpoint.")


def main(argv):
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  if not _WORKDIR.value or not _OUT.value:
    sys.exit("error: --workdir and --out are required: python -m abspos_jax.export_hf --workdir=DIR --out=HF_DIR")
  logging.set_verbosity(logging.ERROR)  # orbax logs every restore at INFO
  from abspos_jax import checkpoint
  from abspos_jax.interop import hf
  try:
    config, model, step = checkpoint.load_model(_WORKDIR.value, _STEP.value)
    written = hf.export(config, model, _OUT.value)
  except (ValueError, FileNotFoundError, FileExistsError, PermissionError) as e:
    sys.exit(f"error: {e}")
  print(f"wrote {_OUT.value}: {written['architectures'][0]} (model_type {written['model_type']}) from step {step} "
        f"of {_WORKDIR.value}")


if __name__ == "__main__":
  app.run(main)
