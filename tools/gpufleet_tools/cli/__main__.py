import sys

from gpufleet_tools.cli import main

sys.exit(main())
