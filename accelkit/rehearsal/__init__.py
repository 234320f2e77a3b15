"""accelkit.rehearsal"""
