"""The GGUF file a bench tool runs llama.cpp on: a path as given, or the file of a model tandem
knows by name (`gemma3-270m`, `smollm2-135m`), fetched into tandem's cache by tandem itself on
first use (the path `tandem score --json` reports)."""
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TANDEM = ROOT / "target/release/tandem"


def gguf_path(model):
    """`model` if it is a file, else the cached file of the known model of that name."""
    if Path(model).is_file():
        return str(Path(model).resolve())
    out = subprocess.run([str(TANDEM), "score", "--model", model, "--tokens", "1,1", "--json",
                          "--threads", "1"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["model"]
