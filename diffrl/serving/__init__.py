"""Serving a reward over HTTP (``diffrl serve-reward``): the server and what one client may cost it.
Above rewards/ (it serves any of them); its client and wire protocols are in :mod:`diffrl.transport`."""
