"""Interop with other tools' model formats (needs the optional ``.[hf]`` extra; imported lazily)."""
