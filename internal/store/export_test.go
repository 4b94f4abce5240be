package store

// ListQueries are the lists' statements by the index that serves each, for
// the EXPLAIN test in store_test.
var ListQueries = []struct{ Index, SQL string }{
	{"enrollments_student", sqlStudentEnrollments},
	{"enrollments_roster", sqlRoster},
	{"enrollments_course", sqlRosterByStatus},
	{"coupons_user", sqlUserCoupons},
	{"notifications_unread", sqlInboxUnread},
	{"notifications_inbox", sqlInbox},
}
