"""`specdec export` (command.py): a trained drafter written in a layout another tool reads. The
layouts themselves, read and written, live beside the drafters: specdec.heads.medusa_formats and
specdec.heads.eagle_formats (loading a drafter imports them), so heads never depend on this package."""
