"""Push a checkpoint folder (weights, config, remote-code files, tokenizer, model card) to the Hugging Face Hub.

    python scripts/push_to_hub.py runs/baseline/final --repo-id ORG/NAME [--private] [--revision R] [--dry-run]

The card uploaded as README.md is rendered for ORG/NAME from the folder's config and metrics (the folder itself
is not changed). --dry-run checks the folder (file list, card, and that it loads with trust_remote_code in a
fresh interpreter without hf_valuearch) and prints what would be uploaded, without touching the network.
Uploading needs a token (`hf auth login` or HF_TOKEN) and network access.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hf_valuearch.cards.hub import (  # noqa: E402
    HubUnavailable,
    card_for_upload,
    check_remote_load,
    checkpoint_files,
    upload_checkpoint,
)


def dry_run(folder: Path, repo_id: str) -> None:
    files, card = checkpoint_files(folder), card_for_upload(folder, repo_id)
    loaded = check_remote_load(folder)
    print(f"{folder} loads with trust_remote_code without hf_valuearch: {loaded} parameters")
    print(f"would upload to https://huggingface.co/{repo_id}:")
    for name in files:
        print(f"  {name:40s} {(folder / name).stat().st_size:>14,d} bytes")
    print(f"  {'README.md':40s} {len(card.encode()):>14,d} bytes (model card rendered for {repo_id})")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="checkpoint folder (e.g. OUTPUT_DIR/final of scripts/train.py)")
    parser.add_argument("--repo-id", required=True, help="ORG/NAME on the Hub")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--revision", default=None, help="branch to upload to (created if missing)")
    parser.add_argument("--dry-run", action="store_true", help="validate and list the files; upload nothing")
    args = parser.parse_args(argv)
    try:
        if args.dry_run:
            dry_run(args.folder, args.repo_id)
        else:
            print(upload_checkpoint(args.folder, args.repo_id, private=args.private or None, revision=args.revision))
    except (ValueError, HubUnavailable) as error:
        raise SystemExit(f"push_to_hub.py: error: {error}") from None


if __name__ == "__main__":
    main()
