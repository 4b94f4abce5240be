// The user's enrollment burst, for people who run k6 themselves:
//
//   TOKEN=$(go run ./cmd/claimflow token --sub k6 --role admin --ttl 2h)
//   k6 run -e TOKEN=$TOKEN deploy/k6/enroll-burst.js
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e COURSES=100 -e SEATS=5000 -e TOKEN=$TOKEN deploy/k6/enroll-burst.js
//
// TOKEN is an admin's bearer token (it creates courses and enrolls any
// student); leave it out for an API started with --insecure-no-auth.
//
// Ramp from 0 to 2,000 iterations/s over 30 s, hold 2,000/s for 3 min 20 s,
// ramp down over 10 s; each VU enrolls one student, then sleeps 1 s. The
// same scenario, plus stage latencies from Postgres and an exactly-once audit
// of the Kafka topic, is `claimflow-bench burst` (and `claimflow-bench
// compare` against a transactional-outbox peer); this script only measures
// the HTTP side.
import http from 'k6/http';
import { check, sleep } from 'k6';
import exec from 'k6/execution';

const BASE_URL = __ENV.BASE_URL || 'http://127.0.0.1:8080';
const COURSES = parseInt(__ENV.COURSES || '100', 10);
const SEATS = parseInt(__ENV.SEATS || '5000', 10);
const STUDENTS = parseInt(__ENV.STUDENTS || '1000000', 10);

export const options = {
  scenarios: {
    enroll_burst: {
      executor: 'ramping-arrival-rate',
      startRate: 0,
      timeUnit: '1s',
      preAllocatedVUs: 2000,
      maxVUs: 5000,
      stages: [
        { target: 2000, duration: '30s' },
        { target: 2000, duration: '3m20s' },
        { target: 0, duration: '10s' },
      ],
    },
  },
  // 201 enrolled and 409 (course full / already enrolled) are answers, not
  // failures; everything else counts in http_req_failed.
  thresholds: {
    http_req_failed: ['rate<0.01'],
  },
};

http.setResponseCallback(http.expectedStatuses(201, 409));

const HEADERS = { 'Content-Type': 'application/json' };
if (__ENV.TOKEN) {
  HEADERS.Authorization = `Bearer ${__ENV.TOKEN}`;
}
const JSON_HEADERS = { headers: HEADERS };

export function setup() {
  const run = `k6${Date.now().toString(36)}`;
  const courses = [];
  for (let i = 0; i < COURSES; i++) {
    const id = `${run}-c${String(i).padStart(3, '0')}`;
    const res = http.post(`${BASE_URL}/v1/courses`,
      JSON.stringify({ id, title: `k6 ${id}`, capacity: SEATS }), JSON_HEADERS);
    if (res.status !== 201) {
      throw new Error(`create course ${id}: ${res.status} ${res.body}`);
    }
    courses.push(id);
  }
  return { courses };
}

export default function (data) {
  const n = exec.scenario.iterationInTest;
  const course = data.courses[Math.floor(Math.random() * data.courses.length)];
  const res = http.post(`${BASE_URL}/v1/courses/${course}/enrollments`,
    JSON.stringify({ student_id: `s${n % STUDENTS}` }), JSON_HEADERS);
  check(res, { 'enrolled or refused (201/409)': (r) => r.status === 201 || r.status === 409 });
  sleep(1);
}
