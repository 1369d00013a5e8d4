"""`python -m tf_tpu_embed_opt`: the command line (see `tf_tpu_embed_opt.cli`)."""

import sys

from tf_tpu_embed_opt.cli import main

if __name__ == "__main__":
    sys.exit(main())
