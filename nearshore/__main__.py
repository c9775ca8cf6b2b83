import sys

from nearshore.cli import main

sys.exit(main())
