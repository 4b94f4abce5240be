package store

// ListQueries are the lists' statements, each with the index that serves
// it, for the EXPLAIN test in store_test.
var ListQueries = []struct{ Name, Index, SQL string }{
	{"student", "enrollments_student", sqlStudentEnrollments},
	{"roster", "enrollments_roster", sqlRoster},
	{"roster by status", "enrollments_roster", sqlRosterByStatus},
	{"coupons", "coupons_user", sqlUserCoupons},
	{"unread", "notifications_unread", sqlInboxUnread},
	{"inbox", "notifications_inbox", sqlInbox},
}
