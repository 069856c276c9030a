"""GCS emulator fixture (fake-gcs-server on loopback)."""
