"""Offline data: readers of photo sources that install from package registries (``sources``)
and the assembly of data sets from them."""
