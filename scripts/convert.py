"""Convert a checkpoint directory between transformers' Llama and the hf_valuearch architectures.

    python scripts/convert.py --input SRC --output DST --to TARGET

SRC is a `LlamaForCausalLM` or hf_valuearch checkpoint directory; TARGET is `llama`, `valuearch` or a
named architecture (see `hf_valuearch.conversion.CONVERTERS`). The output directory holds the weights,
the config, the remote-code files and the tokenizer files found in SRC.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch.conversion import CONVERTERS, convert_checkpoint  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="source checkpoint directory")
    parser.add_argument("--output", required=True, help="destination directory")
    parser.add_argument("--to", required=True, choices=sorted(CONVERTERS), help="target architecture")
    args = parser.parse_args(argv)
    if not Path(args.input).is_dir():
        parser.error(f"--input {args.input!r} is not a directory")
    model = convert_checkpoint(args.input, args.output, args.to)
    print(f"converted {args.input} -> {args.output} ({model.config.model_type}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters)")


if __name__ == "__main__":
    main()
