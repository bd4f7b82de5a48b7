"""``python -m engine.train.context_i2w``: the same command as ``python -m engine train context-i2w``."""
from .cli import main

raise SystemExit(main())
