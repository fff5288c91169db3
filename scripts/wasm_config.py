#!/usr/bin/env python3
"""Print one value from the repo's wasm-pack.toml, e.g. `wasm_config.py build.targets`.

Lists are printed space-joined, booleans as true/false, so shell scripts can use the
output directly. Keeps wasm-pack.toml the single source of these settings.
"""
import sys
import tomllib
from pathlib import Path

CONFIG = Path(__file__).resolve().parent.parent / "wasm-pack.toml"


def main() -> int:
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} SECTION.KEY  (e.g. wasm-bindgen.version)", file=sys.stderr)
        return 2
    key = sys.argv[1]
    try:
        value = tomllib.loads(CONFIG.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        print(f"wasm_config: cannot read {CONFIG}: {e}", file=sys.stderr)
        return 1
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            print(f"wasm_config: key '{key}' not found in {CONFIG}", file=sys.stderr)
            return 1
        value = value[part]
    if isinstance(value, dict):
        print(f"wasm_config: '{key}' is a table, ask for one of its keys: "
              f"{', '.join(value)}", file=sys.stderr)
        return 1
    if isinstance(value, bool):
        print("true" if value else "false")
    elif isinstance(value, list):
        print(" ".join(str(v) for v in value))
    else:
        print(value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
