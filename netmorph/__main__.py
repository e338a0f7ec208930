import sys

from netmorph.cli import main

sys.exit(main())
