"""The base of the layers: errors, plugin hygiene, keyed randomness, the environment pins, the
registries' lookup, and the types between the stages. Imports nothing of diffrl above it."""
