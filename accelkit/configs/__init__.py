"""accelkit.configs"""
