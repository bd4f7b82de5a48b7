"""Training entry points, one module per learned part (`python -m engine train NAME`)."""
