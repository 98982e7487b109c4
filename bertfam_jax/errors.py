"""The error every user mistake raises (a bad value, missing data, an impossible length, a corrupt
or mismatched checkpoint): `main` prints its message as one line and exits 2. Here, importing
nothing, so that any module can raise it (`config_lib.ConfigError` is the same class)."""


class ConfigError(ValueError):
  """A configuration or input that cannot run; the message names the field or file and the fix."""
