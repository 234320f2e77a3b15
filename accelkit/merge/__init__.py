"""accelkit.merge"""
