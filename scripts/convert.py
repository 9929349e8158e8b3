"""Convert a checkpoint directory between transformers' Llama and the hf_valuearch architectures.

    python scripts/convert.py --input SRC --output DST --to TARGET

SRC is a `LlamaForCausalLM` or hf_valuearch checkpoint directory; TARGET is `llama`, `valuearch` or a
named architecture (see `hf_valuearch.conversion.CONVERTERS`). The output directory holds the weights,
the config, the remote-code files and the tokenizer files found in SRC. After converting, the script prints
the largest logit difference between the converted model and SRC on a fixed probe batch, and whether the
conversion is exact by construction.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch.conversion import (  # noqa: E402
    CONVERTERS,
    conversion_report,
    convert,
    load_for_conversion,
    save_converted,
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="source checkpoint directory")
    parser.add_argument("--output", required=True, help="destination directory")
    parser.add_argument("--to", required=True, choices=sorted(CONVERTERS), help="target architecture")
    args = parser.parse_args(argv)
    try:
        source = load_for_conversion(args.input)
        model = convert(source, args.to)
    except ValueError as error:
        sys.exit(f"convert.py: error: {error}")
    save_converted(model, args.output, args.input)
    print(f"converted {args.input} -> {args.output} ({model.config.model_type}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters)")
    print(conversion_report(source, model, args.to))


if __name__ == "__main__":
    main()
