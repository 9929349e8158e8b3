"""Convert a checkpoint directory to an hf_valuearch architecture (or a standard model back to Llama).

    python scripts/convert.py --input SRC --output DST --to TARGET
    python scripts/convert.py --input SRC --output DST --from FORMAT [--reference-logits FILE]

--to: SRC is a `LlamaForCausalLM` or hf_valuearch checkpoint directory; TARGET is `llama`, `valuearch` or a
named architecture (see `hf_valuearch.conversion.CONVERTERS`). After converting, the script prints the
largest logit difference between the converted model and SRC on a fixed probe batch, and whether the
conversion is exact by construction.

--from: SRC was written by a paper's own code (see `hf_valuearch.conversion.FORMATS`); features that
hf_valuearch cannot represent are refused by name. That code is not part of hf_valuearch, so the logit
difference is measured only against logits it produced: --reference-logits FILE, a safetensors file with
`input_ids` and `logits`.

The output directory holds the weights, the config, the remote-code files and the tokenizer files found in SRC.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch.conversion import (  # noqa: E402
    CONVERTERS,
    FORMATS,
    conversion_report,
    convert,
    convert_paper_checkpoint,
    load_for_conversion,
    reference_logit_difference,
    save_converted,
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="source checkpoint directory")
    parser.add_argument("--output", required=True, help="destination directory")
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--to", choices=sorted(CONVERTERS), help="target architecture of a Llama/hf_valuearch SRC")
    direction.add_argument("--from", dest="source_format", choices=sorted(FORMATS),
                           help="format of a SRC written by a paper's code")
    parser.add_argument("--reference-logits", help="(--from) safetensors file with input_ids and the logits the "
                                                   "paper's code produced for them")
    args = parser.parse_args(argv)
    if args.reference_logits and not args.source_format:
        parser.error("--reference-logits goes with --from (a --to conversion measures against SRC itself)")
    try:
        if args.source_format:
            model = convert_paper_checkpoint(args.source_format, args.input)
            difference = (reference_logit_difference(model, args.reference_logits)
                          if args.reference_logits else None)
        else:
            source = load_for_conversion(args.input)
            model = convert(source, args.to)
    except ValueError as error:
        sys.exit(f"convert.py: error: {error}")
    save_converted(model, args.output, args.input)
    print(f"converted {args.input} -> {args.output} ({model.config.model_type}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters)")
    if not args.source_format:
        print(conversion_report(source, model, args.to))
        return
    paper_format = FORMATS[args.source_format]
    if difference is None:
        print(f"max |logit difference| against the source: not measured (the source runs only with "
              f"{paper_format.code}'s code; pass --reference-logits with logits it produced)")
    else:
        print(f"max |logit difference| against the source's logits in {args.reference_logits}: {difference:.3g}")
    print(f"exact by construction: yes ({paper_format.note})")


if __name__ == "__main__":
    main()
