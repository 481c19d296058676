import sys

from moespac.cli import main

sys.exit(main())
