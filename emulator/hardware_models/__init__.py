"""The emulator's hardware models: measured step times as JSON, and the scripts that fit them."""
