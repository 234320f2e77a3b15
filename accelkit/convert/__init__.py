"""accelkit.convert"""
