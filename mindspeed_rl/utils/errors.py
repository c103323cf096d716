"""User-facing errors.

A `UserInputError` carries one plain sentence that names the key, file or line at fault and the
fix. Entry points (ray_gpt.py, preprocess_data.py, convert_ckpt.py) print it without a traceback
and exit with status 2. Anything else is a bug and keeps its traceback.
"""


class UserInputError(ValueError):
    """Bad config, data or checkpoint. str(err) is the whole message shown to the user."""
