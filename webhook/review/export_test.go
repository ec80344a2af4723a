package review

// CheckBudgets is checkBudgets, for the tests of package review_test.
var CheckBudgets = checkBudgets
