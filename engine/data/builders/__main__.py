"""``python -m engine.data.builders``: build or inspect the offline data sets."""
from . import main

raise SystemExit(main())
