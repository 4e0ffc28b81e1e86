"""power package."""
